//! `pinion agent` with real containers (the libcontainer runtime) on this host
//! (topology discovered from its /sys):
//! CPU 0 reserved, exclusive pods on CPU 1, shared pods following the pool in
//! place, OOM kills in the status, and `kill -9` of the agent with pods running.
//! Needs root and two CPUs: without them the tests skip, except under `CI=true`
//! where they fail. Pod names carry the test's pid; whatever a failed test
//! leaves is removed through the runtime on drop.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nodelet::runtime::libcontainer::LibcontainerRuntime;
use nodelet::runtime::Runtime;
use pinion_wire::testing::{has_two_cpus, is_root, requires};
use serde_json::Value;

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

/// The tests share the host's CPU 1: one at a time.
static HOST: Mutex<()> = Mutex::new(());

struct Host {
    tmp: tempfile::TempDir,
    manifests: PathBuf,
    data: PathBuf,
    agent: Option<Child>,
    /// Flags added to every agent start.
    extra: Vec<String>,
    /// A test's own CNI bridge, removed on drop (after the pods' networks).
    bridge: Option<String>,
}

/// `None` (skip) without root or two CPUs, outside CI.
fn host() -> Option<Host> {
    if !requires(is_root() && has_two_cpus(), "root and CPUs 0 and 1") {
        return None;
    }
    let tmp = tempfile::Builder::new().prefix("pinion-agent-").tempdir().unwrap();
    let manifests = tmp.path().join("manifests");
    std::fs::create_dir(&manifests).unwrap();
    let data = tmp.path().join("data");
    // The agent's pod network is read from the test's own folder (empty
    // unless a test writes one), never the host's /etc/cni/net.d, where a
    // host's `pinion up` may have written one.
    let extra = vec!["--cni-conf-dir".to_string(), tmp.path().join("net.d").display().to_string()];
    Some(Host { manifests, data, agent: None, tmp, extra, bridge: None })
}

impl Host {
    fn start_agent(&mut self) {
        self.start_agent_confined_to(None);
    }

    /// `cpus`: run the agent under `taskset -c CPUS`, as a node that keeps its
    /// system services on the reserved CPUs does.
    fn start_agent_confined_to(&mut self, cpus: Option<&str>) {
        let mut cmd = match cpus {
            Some(list) => {
                let mut c = Command::new("taskset");
                c.args(["-c", list, PINION]);
                c
            }
            None => Command::new(PINION),
        };
        let child = cmd
            .args(["agent", "--runtime", "libcontainer", "--reserved-cpus", "0", "--node-name", "real"])
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--data-dir")
            .arg(&self.data)
            .args(&self.extra)
            // The topology is this host's, discovered from /sys.
            .env("PINION_LOG", "warn,nodelet=info,libcgroups=error,libcontainer=error")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(self.agent_log_file())
            .spawn()
            .unwrap();
        self.agent = Some(child);
    }

    /// The agent's stderr, appended to across restarts.
    fn agent_log_file(&self) -> std::fs::File {
        std::fs::OpenOptions::new().create(true).append(true).open(self.tmp.path().join("agent.log")).unwrap()
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("agent.log")).unwrap_or_default()
    }

    fn signal_agent(&mut self, sig: &str) {
        let mut child = self.agent.take().unwrap();
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status().unwrap().success();
        assert!(ok);
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "agent did not exit after SIG{sig}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn write(&self, stem: &str, yaml: &str) {
        std::fs::write(self.manifests.join(format!("{stem}.yaml")), yaml).unwrap();
    }

    fn status(&self) -> Option<Value> {
        let out = Command::new(PINION)
            .args(["agent", "status", "-o", "json", "--data-dir"])
            .arg(&self.data)
            .output()
            .unwrap();
        out.status.success().then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    fn wait(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(v) = self.status() {
                if pred(&v) {
                    return v;
                }
                last = Some(v);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}; last status: {last:#?}");
    }

    fn log(&self, stem: &str) -> String {
        // Log folders are per pod uid; the newest one of the key is this pod's.
        let path = nodelet::endpoint::newest_log(&self.data, &format!("static/{stem}"), "main");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    fn wait_log(&self, stem: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log(stem);
            if pred(&log) {
                return log;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what} in the log of {stem}: {log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runtime ids of the pod's containers (its directories under the data dir).
    fn container_ids(&self, stem: &str) -> Vec<String> {
        let prefix = format!("static-{stem}_");
        let mut ids: Vec<String> = std::fs::read_dir(self.data.join("containers"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        ids.retain(|id| id.starts_with(&prefix));
        ids.sort();
        ids
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut a) = self.agent.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
        // A failed test's pod tuning goes back too: these are the host's IRQs and CPUs.
        if let Ok(t) = nodelet::tuning::Tuner::new(PathBuf::from("/"), self.data.join("tuning")) {
            for sandbox in t.recorded().unwrap_or_default() {
                let _ = t.restore(&sandbox);
            }
        }
        if let Ok(rt) = LibcontainerRuntime::new(&self.data, Path::new(PINION)) {
            for id in rt.list().unwrap_or_default() {
                let _ = rt.stop(&id, Duration::ZERO);
                let _ = rt.remove(&id);
            }
        }
        if let Some(bridge) = &self.bridge {
            // The plugins undo what they did (NAT rules included), then the bridge goes.
            let cni = nodelet::cni::CniConfig::new(self.tmp.path().join("net.d"), vec![PathBuf::from("/usr/lib/cni")]);
            if let Ok(nets) = nodelet::cni::PodNetworks::new(cni, self.data.join("cni")) {
                if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    for s in nets.leftovers() {
                        let _ = rt.block_on(nets.teardown(&s));
                    }
                }
            }
            let _ = Command::new("ip").args(["link", "del", bridge]).output();
        }
    }
}

/// A pod of one container with a CPU limit of `cpu`. A fractional limit makes a
/// shared container that requests no CPU: with CPU 0 reserved this host has one
/// allocatable CPU, which the exclusive pod beside it requests whole.
fn pod(name: &str, cpu: &str, command: &str, policy: &str) -> String {
    let requests = if cpu.ends_with('m') { "requests: {cpu: '0'}, " } else { "" };
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{command}']\n    resources: {{{requests}limits: {{cpu: '{cpu}', memory: 64Mi}}}}\n"
    )
}

const SHOW_AND_SLEEP: &str = "grep -E \"^(Cpus|Mems)_allowed_list\" /proc/self/status; exec sleep 1000";
const SHOW_EVERY_100MS: &str = "while true; do grep ^Cpus_allowed_list /proc/self/status; sleep 0.1; done";

fn last_line(log: &str) -> &str {
    log.lines().last().unwrap_or("")
}

fn cgroup_file(id: &str, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/cpuset/pinion/{id}/{file}"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/pinion/{id}/{file}.effective")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Pids whose cgroup is one of this test's containers (tag: the test's pid).
fn processes(tag: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                        .is_ok_and(|c| c.lines().any(|l| l.contains("/pinion/") && l.contains(tag)))
                })
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// Cgroup directories of this test's containers, every hierarchy.
fn cgroups(tag: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for base in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        for e in std::fs::read_dir(base.path().join("pinion")).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().contains(tag) {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// The containers' long-lived processes: `sleep 1000` and the looping `sh` (their
/// short-lived children come and go every 100 ms).
fn long_lived(tag: &str) -> Vec<i32> {
    let look = || -> Vec<i32> {
        processes(tag)
            .into_iter()
            .filter(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmd.starts_with(b"sh\0") || cmd.starts_with(b"sleep\x001000")
            })
            .collect()
    };
    // A shell's child between its fork and its exec (the loop's `grep` or
    // `sleep 0.1`) still reads `sh`: only what two looks 300 ms apart both
    // see lives long.
    let first = look();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let second = look();
    first.into_iter().filter(|p| second.contains(p)).collect()
}

fn mounts(under: &Path) -> usize {
    let root = under.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().filter(|l| l.contains(&root)).count()
}

#[test]
fn exclusive_pod_on_cpu_1_and_a_shared_pod_that_follows_the_pool_in_place() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let (ex, sh) = (format!("ex-{pid}"), format!("sh-{pid}"));
    h.write(&ex, &pod(&ex, "1", SHOW_AND_SLEEP, "Always"));
    h.start_agent();
    h.wait("ex running", |v| v["pods"][format!("static/{ex}")]["phase"] == "Running");
    h.write(&sh, &pod(&sh, "500m", SHOW_EVERY_100MS, "Always"));
    let v = h.wait("sh running", |v| v["pods"][format!("static/{sh}")]["phase"] == "Running");
    assert_eq!(v["pods"][format!("static/{ex}")]["placement"]["containers"][0]["cpus"], serde_json::json!([1]));

    // Inside the exclusive container, and in its cgroup.
    let log = h.wait_log(&ex, "its cpuset", |l| l.contains("Mems_allowed_list"));
    assert!(log.contains("Cpus_allowed_list:\t1\n"), "{log}");
    assert!(log.contains("Mems_allowed_list:\t0\n"), "{log}");
    let ex_id = h.container_ids(&ex).pop().unwrap();
    assert_eq!((cgroup_file(&ex_id, "cpuset.cpus"), cgroup_file(&ex_id, "cpuset.mems")), ("1".into(), "0".into()));

    // The node's own work stays on the reserved CPU: every agent thread, and
    // the shims once their containers run.
    let agent_pid = h.agent.as_ref().unwrap().id();
    for task in std::fs::read_dir(format!("/proc/{agent_pid}/task")).unwrap().flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        assert!(status.is_empty() || status.contains("Cpus_allowed_list:\t0\n"), "agent thread: {status}");
    }
    let shim: Value =
        serde_json::from_slice(&std::fs::read(h.data.join(format!("containers/{ex_id}/shim.json"))).unwrap()).unwrap();
    let shim_status = std::fs::read_to_string(format!("/proc/{}/status", shim["pid"])).unwrap();
    assert!(shim_status.contains("Cpus_allowed_list:\t0\n"), "shim: {shim_status}");

    // The shared pod gets what is left: CPU 0.
    h.wait_log(&sh, "CPU 0 only", |l| last_line(l) == "Cpus_allowed_list:\t0");
    let sh_ids = h.container_ids(&sh);
    assert_eq!(sh_ids.len(), 1);
    assert_eq!(cgroup_file(&sh_ids[0], "cpuset.cpus"), "0");
    let sh_pids = processes(&sh_ids[0]);

    // The exclusive pod goes: the shared one grows back to 0-1 without a restart.
    std::fs::remove_file(h.manifests.join(format!("{ex}.yaml"))).unwrap();
    h.wait("ex gone", |v| v["pods"][format!("static/{ex}")].is_null());
    h.wait_log(&sh, "CPUs 0-1", |l| last_line(l) == "Cpus_allowed_list:\t0-1");
    assert_eq!(cgroup_file(&sh_ids[0], "cpuset.cpus"), "0-1");
    assert_eq!(h.container_ids(&sh), sh_ids, "same container");
    assert!(processes(&sh_ids[0]).contains(&sh_pids[0]), "same process: not restarted");
    let v = h.status().unwrap();
    assert_eq!(v["pods"][format!("static/{sh}")]["containerStatuses"][0]["restartCount"], 0);
    // A pod leaves the report when its containers are stopped; their removal
    // is the runtime's next step (retried if it fails), so it may come a
    // moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !(h.container_ids(&ex).is_empty() && cgroups(&ex_id).is_empty()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(h.container_ids(&ex).is_empty(), "the exclusive container is removed; agent log:\n{}", h.agent_log());
    assert!(cgroups(&ex_id).is_empty(), "its cgroup is removed; agent log:\n{}", h.agent_log());

    std::fs::remove_file(h.manifests.join(format!("{sh}.yaml"))).unwrap();
    h.wait("sh gone", |v| v["pods"][format!("static/{sh}")].is_null());
    h.signal_agent("TERM");
    let tag = pid.to_string();
    assert_eq!(cgroups(&tag), Vec::<PathBuf>::new());
    assert_eq!(processes(&tag), Vec::<i32>::new());
}

/// On Linux 6.2 and later a task keeps the affinity it inherited even when its
/// cpuset is wider; an agent confined to the reserved CPU must not hand that
/// mask to its containers.
#[test]
fn an_agent_confined_to_the_reserved_cpu_does_not_confine_its_containers() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let (ex, sh) = (format!("cex-{pid}"), format!("csh-{pid}"));
    h.write(&sh, &pod(&sh, "500m", SHOW_EVERY_100MS, "Always"));
    h.start_agent_confined_to(Some("0"));
    h.wait("sh running", |v| v["pods"][format!("static/{sh}")]["phase"] == "Running");
    h.wait_log(&sh, "the whole pool", |l| last_line(l) == "Cpus_allowed_list:\t0-1");
    h.write(&ex, &pod(&ex, "1", SHOW_AND_SLEEP, "Always"));
    let log = h.wait_log(&ex, "its cpuset", |l| l.contains("Mems_allowed_list"));
    assert!(log.contains("Cpus_allowed_list:\t1\n"), "{log}");
    h.wait_log(&sh, "CPU 0 only", |l| last_line(l) == "Cpus_allowed_list:\t0");
    std::fs::remove_file(h.manifests.join(format!("{ex}.yaml"))).unwrap();
    h.wait_log(&sh, "back to 0-1", |l| last_line(l) == "Cpus_allowed_list:\t0-1");
    std::fs::remove_file(h.manifests.join(format!("{sh}.yaml"))).unwrap();
    h.wait("both gone", |v| v["pods"].as_object().is_some_and(|m| m.is_empty()));
    h.signal_agent("TERM");
}

#[test]
fn kill_9_of_the_agent_keeps_containers_cpus_and_leaks_nothing() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let tag = format!("-{pid}_");
    let (ex, sh) = (format!("kex-{pid}"), format!("ksh-{pid}"));
    let counts = |h: &Host| (cgroups(&tag).len(), long_lived(&tag).len(), mounts(&h.data));
    assert_eq!(counts(&h), (0, 0, 0));
    h.write(&ex, &pod(&ex, "1", SHOW_AND_SLEEP, "Always"));
    h.write(&sh, &pod(&sh, "500m", SHOW_EVERY_100MS, "Always"));
    h.start_agent();
    let running = |v: &Value| {
        [&ex, &sh].iter().all(|k| v["pods"][format!("static/{k}")]["phase"] == "Running")
            && v["pods"][format!("static/{k}", k = sh)]["placement"]["containers"][0]["cpus"] == serde_json::json!([0])
    };
    let before = h.wait("both running", running);
    h.wait_log(&sh, "CPU 0", |l| last_line(l) == "Cpus_allowed_list:\t0");
    let ids_before = (h.container_ids(&ex), h.container_ids(&sh));
    let procs_before = long_lived(&tag);
    assert_eq!(procs_before.len(), 2, "one sleep, one sh");
    let counts_before = counts(&h);

    h.signal_agent("KILL");
    assert_eq!(long_lived(&tag), procs_before, "containers outlive the agent");
    h.start_agent();
    let after = h.wait("both adopted", running);
    assert_eq!(after["allocations"], before["allocations"], "same CPUs, nothing re-allocated");
    assert_eq!((h.container_ids(&ex), h.container_ids(&sh)), ids_before, "same containers");
    assert_eq!(long_lived(&tag), procs_before, "same processes");
    assert_eq!(counts(&h), counts_before, "no leaked cgroup, mount or process");
    assert_eq!(after["pods"][format!("static/{ex}")]["containerStatuses"][0]["restartCount"], 0);

    // A pod removed while the agent is down is stopped after it comes back.
    h.signal_agent("KILL");
    std::fs::remove_file(h.manifests.join(format!("{ex}.yaml"))).unwrap();
    h.start_agent();
    h.wait("ex stopped", |v| v["pods"][format!("static/{ex}")].is_null());
    h.wait_log(&sh, "CPUs 0-1", |l| last_line(l) == "Cpus_allowed_list:\t0-1");
    std::fs::remove_file(h.manifests.join(format!("{sh}.yaml"))).unwrap();
    h.wait("sh stopped", |v| v["pods"][format!("static/{sh}")].is_null());
    h.signal_agent("TERM");
    assert_eq!(counts(&h), (0, 0, 0), "everything gone");
    assert_eq!(processes(&tag), Vec::<i32>::new());
}

#[test]
fn oom_kill_and_exit_codes_show_in_the_status() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let (oom, fail) = (format!("oom-{pid}"), format!("fail-{pid}"));
    // `tail` keeps a line in memory: 256 MiB without a newline against a 64 MiB limit.
    h.write(&oom, &pod(&oom, "500m", "head -c 268435456 /dev/zero | tail", "Never"));
    h.write(&fail, &pod(&fail, "500m", "echo bye; exit 3", "OnFailure"));
    h.start_agent();
    let v = h.wait("oom failed", |v| v["pods"][format!("static/{oom}")]["phase"] == "Failed");
    let c = &v["pods"][format!("static/{oom}")]["containerStatuses"][0];
    assert_eq!(c["reason"], "OOMKilled", "{v:#}");
    // The first crash restarts at once; the second waits its backoff.
    let v = h.wait("fail restarted twice", |v| {
        v["pods"][format!("static/{fail}")]["containerStatuses"][0]["restartCount"].as_u64() >= Some(2)
    });
    let c = &v["pods"][format!("static/{fail}")]["containerStatuses"][0];
    assert_eq!((c["lastExitCode"].as_i64(), c["reason"].as_str()), (Some(3), Some("CrashLoopBackOff")), "{v:#}");
    assert!(h.log(&fail).contains("bye"), "logs captured");
    std::fs::remove_file(h.manifests.join(format!("{oom}.yaml"))).unwrap();
    std::fs::remove_file(h.manifests.join(format!("{fail}.yaml"))).unwrap();
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
    assert_eq!(cgroups(&pid.to_string()), Vec::<PathBuf>::new());
}

/// A pod of one container running `command` (a YAML flow sequence) as is,
/// without a shell.
fn job(name: &str, command: &str, init: bool, grace: u32) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  init: {init}\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: main\n    rootfs: host\n    command: {command}\n    resources: {{requests: {{cpu: '0'}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

#[test]
fn a_command_that_cannot_run_fails_the_job_at_once() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let (missing, plain) = (format!("missing-{pid}"), format!("plain-{pid}"));
    h.write(&missing, &job(&missing, &format!("[no-such-command-{pid}, x]"), false, 1));
    // Found, but not executable.
    h.write(&plain, &job(&plain, "[/etc/passwd]", false, 1));
    h.start_agent();
    for (stem, code, what) in [(&missing, 127, format!("no-such-command-{pid}")), (&plain, 126, "/etc/passwd".into())] {
        let v = h.wait("the job failed", |v| v["pods"][format!("static/{stem}")]["phase"] == "Failed");
        let p = &v["pods"][format!("static/{stem}")];
        let c = &p["containerStatuses"][0];
        assert_eq!(
            (c["lastExitCode"].as_i64(), c["reason"].as_str()),
            (Some(code), Some("ContainerCannotRun")),
            "{p:#}"
        );
        assert_eq!(c["restartCount"], 0, "{p:#}");
        let message = p["message"].as_str().unwrap_or("");
        assert!(message.contains(&what) && !message.contains('\n') && message.len() < 200, "{message:?}");
        assert!(h.container_ids(stem).is_empty(), "nothing left of {stem}");
    }
    std::fs::remove_file(h.manifests.join(format!("{missing}.yaml"))).unwrap();
    std::fs::remove_file(h.manifests.join(format!("{plain}.yaml"))).unwrap();
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
}

/// `sleep` as PID 1 ignores SIGTERM (the kernel gives PID 1 no default
/// actions); with `init: true` the init passes it on, so the pod stops on
/// SIGTERM long before its 600 s grace would end in SIGKILL.
#[test]
fn init_forwards_sigterm_so_a_deleted_pod_stops_at_once() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let stem = format!("init-{pid}");
    h.write(&stem, &job(&stem, "[sleep, '1000']", true, 600));
    h.start_agent();
    h.wait("running", |v| v["pods"][format!("static/{stem}")]["phase"] == "Running");
    let id = h.container_ids(&stem).pop().unwrap();
    // PID 1 is the init, its child the command. Between its fork and its
    // exec the child still reads as the init: wait for the exec.
    let mut cmdlines: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let execed = |c: &[String]| c.len() >= 2 && c.iter().any(|l| l == "sleep 1000 ");
    while !execed(&cmdlines) && Instant::now() < deadline {
        cmdlines = processes(&id)
            .iter()
            .map(|p| {
                String::from_utf8_lossy(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default())
                    .replace('\0', " ")
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
    }
    cmdlines.sort();
    assert_eq!(cmdlines, vec!["/.pinion-init init -- sleep 1000 ".to_string(), "sleep 1000 ".to_string()]);

    std::fs::remove_file(h.manifests.join(format!("{stem}.yaml"))).unwrap();
    h.wait("stopped", |v| v["pods"][format!("static/{stem}")].is_null());
    let log = h.agent_log();
    let stopped = log.lines().find(|l| l.contains("container stopped") && l.contains(&id)).unwrap_or("");
    assert!(stopped.contains("code=143"), "stopped by SIGTERM (128 + 15), not SIGKILL: {stopped:?}\n{log}");
    h.signal_agent("TERM");
    assert_eq!(processes(&pid.to_string()), Vec::<i32>::new());
}

/// What a pod network may leave: records, pins, leases, bridge ports, NAT rules.
fn network_leaks(h: &Host, bridge: &str, subnet_prefix: &str, sandboxes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(h.data.join("cni"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| format!("record {}", e.file_name().to_string_lossy()))
        .collect();
    for e in std::fs::read_dir(h.tmp.path().join("leases/pinion-test")).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name != "lock" && !name.starts_with("last_reserved_ip") {
            out.push(format!("lease {name}"));
        }
    }
    let sh = |cmd: &str| {
        String::from_utf8_lossy(&Command::new("sh").args(["-c", cmd]).output().unwrap().stdout).into_owned()
    };
    out.extend(sh(&format!("ip -o link show master {bridge} 2>/dev/null")).lines().map(|l| format!("port {l}")));
    out.extend(sh("iptables -t nat -S").lines().filter(|l| l.contains(subnet_prefix)).map(|l| format!("iptables {l}")));
    let pins = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for sandbox in sandboxes {
        let pin = Path::new(nodelet::cni::DEFAULT_NETNS_DIR).join(sandbox);
        if pin.exists() || pins.contains(&pin.display().to_string()) {
            out.push(format!("pin {}", pin.display()));
        }
    }
    out
}

#[test]
fn pods_reach_each_other_over_cni_and_a_kill_9_leaks_no_network() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    if !requires(Path::new("/usr/lib/cni/bridge").is_file(), "/usr/lib/cni (containernetworking-plugins)") {
        return;
    }
    let pid = std::process::id();
    // A bridge and a subnet this test owns; leases in its folder.
    let bridge = format!("pa{}", pid % 100_000);
    let prefix = format!("10.251.{}", pid % 250);
    h.bridge = Some(bridge.clone());
    let conf = h.tmp.path().join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    let leases = h.tmp.path().join("leases");
    std::fs::write(
        conf.join("10-test.conflist"),
        format!(
            r#"{{"cniVersion": "1.0.0", "name": "pinion-test", "plugins": [{{"type": "bridge", "bridge": "{bridge}", "isGateway": true, "ipMasq": true, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{prefix}.0/24"}}]], "dataDir": "{}"}}}}]}}"#,
            leases.display()
        ),
    )
    .unwrap();
    h.extra = vec!["--cni-conf-dir".into(), conf.display().to_string()];
    let (a, b) = (format!("neta-{pid}"), format!("netb-{pid}"));
    h.write(&a, &pod(&a, "500m", "exec sleep 1000", "Always"));
    h.start_agent();
    let ip_of = |v: &Value, k: &str| v["pods"][format!("static/{k}")]["podIP"].as_str().map(String::from);
    let v = h.wait("a running with an address", |v| {
        v["pods"][format!("static/{a}")]["phase"] == "Running" && ip_of(v, &a).is_some()
    });
    let ip_a = ip_of(&v, &a).unwrap();
    assert!(ip_a.starts_with(&prefix), "{ip_a}");
    // The second pod's container reaches the first over the bridge.
    let reach = format!("ping -c1 -W5 {ip_a} >/dev/null && echo reached || echo unreachable; exec sleep 1000");
    h.write(&b, &pod(&b, "500m", &reach, "Always"));
    h.wait_log(&b, "the ping", |l| l.contains("reached"));
    assert_eq!(h.log(&b).trim(), "reached", "{}", h.log(&b));
    let v = h.wait("b's address", |v| ip_of(v, &b).is_some());
    assert_ne!(ip_of(&v, &b), Some(ip_a.clone()));
    let sandboxes: Vec<String> = std::fs::read_dir(h.data.join("cni"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(String::from))
        // The agent's networks made ahead (`w…`) are no pod's.
        .filter(|s| s.starts_with('p'))
        .collect();
    assert_eq!(sandboxes.len(), 2, "one network per pod");
    let leaks = network_leaks(&h, &bridge, &prefix, &sandboxes);
    for what in ["record", "lease", "port", "pin"] {
        assert!(leaks.iter().any(|l| l.starts_with(what)), "the leak check sees the pods' {what}s: {leaks:?}");
    }

    // kill -9, then a's removal while the agent is down: the restarted agent
    // adopts b's network (CHECK, same address) and removes a's.
    h.signal_agent("KILL");
    std::fs::remove_file(h.manifests.join(format!("{a}.yaml"))).unwrap();
    // What a kill -9 between a network's record and its namespace's mount
    // leaves (CI met it): the record, ADD not run, and a bare file for a pin.
    // The restarted agent removes both (its DEL is told there is no namespace).
    let half = format!("w{}", "0".repeat(23) + "1");
    let conflist: Value = serde_json::from_slice(&std::fs::read(conf.join("10-test.conflist")).unwrap()).unwrap();
    let half_pin = Path::new(nodelet::cni::DEFAULT_NETNS_DIR).join(&half);
    let record = serde_json::json!({"key": "(warm)", "netns": half_pin, "attachments": [{"ifname": "eth0", "config": conflist}]});
    std::fs::write(h.data.join("cni").join(format!("{half}.json")), record.to_string()).unwrap();
    std::fs::write(&half_pin, b"").unwrap();
    // And a kill -9 inside a record's write (CI met it too): its temporary.
    std::fs::write(h.data.join("cni").join(format!(".w{}.json.tmp", "0".repeat(23) + "2")), b"{\"key\"").unwrap();
    let mut sandboxes = sandboxes;
    sandboxes.push(half);
    h.start_agent();
    let v = h.wait("a gone, b adopted", |v| v["pods"][format!("static/{a}")].is_null() && ip_of(v, &b).is_some());
    assert_eq!(v["pods"][format!("static/{b}")]["containerStatuses"][0]["restartCount"], 0);
    std::fs::remove_file(h.manifests.join(format!("{b}.yaml"))).unwrap();
    h.wait("b gone", |v| v["pods"][format!("static/{b}")].is_null());
    // The pods' networks go while the agent runs; the ones it made ahead
    // (the killed agent's ones included) go at the latest when it stops.
    let pods_left = || {
        network_leaks(&h, &bridge, &prefix, &sandboxes)
            .into_iter()
            .filter(|l| l.starts_with("record p") || l.starts_with("pin "))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while pods_left() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    h.signal_agent("TERM");
    assert_eq!(network_leaks(&h, &bridge, &prefix, &sandboxes), Vec::<String>::new(), "{}", h.agent_log());
}

/// Every regular file under `dir` holding `needle`, without entering the
/// containers' own trees (a host-rootfs container's rootfs binds `/usr`).
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(kind) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            if kind.is_dir() && !["rootfs", "upper", "work"].contains(&name.as_str()) {
                todo.push(e.path());
            } else if kind.is_file()
                && std::fs::read(e.path()).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(e.path());
            }
        }
    }
    found.sort();
    found
}

/// Issue 25, finding 4: a pod's env is in the checkpoint, the status file,
/// the container's records and bundle, and its log when it prints it. None
/// of those files may be readable by another host user (`nobody`): the data
/// dir is 0700 and each file 0600, a data dir an older version left open
/// included (it is tightened at start).
#[test]
fn no_file_holding_a_pods_env_is_readable_by_another_user() {
    use std::os::unix::fs::PermissionsExt;
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    // As /var/lib: the folder above the data dir lets everyone through.
    std::fs::set_permissions(h.tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = format!("s3cret-{}-value", std::process::id());
    // What an older version left: an open data dir and an old 0644 log.
    let old_log = h.data.join("logs/static_old_1/main.log");
    std::fs::create_dir_all(old_log.parent().unwrap()).unwrap();
    std::fs::write(&old_log, format!("{secret}\n")).unwrap();
    for (p, mode) in [(&h.data, 0o755), (&h.data.join("logs"), 0o755), (&old_log, 0o644)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let name = format!("env-{}", std::process::id());
    h.write(
        &name,
        &format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, 'echo $SECRET; exec sleep 1000']\n    env: [{{name: SECRET, value: {secret}}}]\n    resources: {{requests: {{cpu: '0'}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
        ),
    );
    h.start_agent();
    h.wait_log(&name, "the secret", |l| l.contains(&secret));
    h.wait("running", |v| v["pods"][format!("static/{name}")]["phase"] == "Running");
    let holding = files_holding(&h.data, &secret);
    let names: Vec<String> =
        holding.iter().map(|p| p.strip_prefix(&h.data).unwrap().to_string_lossy().into_owned()).collect();
    for want in ["checkpoint.json", "container.json", "config.json", "main.log"] {
        assert!(names.iter().any(|n| n.ends_with(want)), "the env is in {want}: {names:?}");
    }
    let mut readable = Vec::new();
    for (path, name) in holding.iter().zip(&names) {
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        let out = Command::new("runuser").args(["-u", "nobody", "--", "cat"]).arg(path).output().unwrap();
        if mode & 0o077 != 0 || out.status.success() {
            readable.push(format!("{name} ({mode:o}, nobody read it: {})", out.status.success()));
        }
    }
    assert!(readable.is_empty(), "readable by others: {readable:#?}");
    let mode = std::fs::metadata(&h.data).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data dir");
    std::fs::remove_file(h.manifests.join(format!("{name}.yaml"))).unwrap();
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
}

/// A pod of one container running `script` under `sh -c` once, with the
/// pod-level fields `extra` (YAML lines of `spec`, indented by two).
fn pod_with(name: &str, extra: &str, script: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n{extra}  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{script}']\n    resources: {{requests: {{cpu: '0'}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n"
    )
}

/// `id -u NAME` on this host.
fn host_id(flag: &str, name: &str) -> String {
    let out = Command::new("id").args([flag, name]).output().unwrap();
    assert!(out.status.success(), "id {flag} {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Issue 27: a pod's processes are the Unix user the pod names, with no
/// capability, and see the host rootfs as that user would: `/etc/shadow`
/// (0640 root:shadow on Debian) is refused. A user name is looked up in the
/// node's passwd (`nobody` is on every Debian host), and a name the node
/// does not know fails the start, naming it.
#[test]
fn a_pods_processes_run_as_its_user_with_no_capabilities() {
    use std::os::unix::fs::MetadataExt;
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    // What the shadow check proves rests on this: others may not read it.
    let shadow = std::fs::metadata("/etc/shadow").unwrap();
    assert_eq!((shadow.uid(), shadow.mode() & 0o004), (0, 0), "/etc/shadow is root's and not world-readable here");
    let pid = std::process::id();
    let (ids, named, ghost) = (format!("uid-{pid}"), format!("named-{pid}"), format!("ghost-{pid}"));
    let unknown = format!("no-such-user-{pid}");
    h.write(
        &ids,
        &pod_with(
            &ids,
            "  securityContext: {runAsUser: 1001, runAsGroup: 1001, supplementalGroups: [1002]}\n",
            "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); grep CapEff /proc/self/status; \
             cat /etc/shadow; echo shadow=$?",
        ),
    );
    // Through the init as PID 1, which must run as the user too.
    h.write(
        &named,
        &pod_with(
            &named,
            "  init: true\n  securityContext: {runAsUserName: nobody}\n",
            "echo uid=$(id -u) gid=$(id -g) home=$HOME; grep -E \"^Cap(Eff|Prm|Bnd)\" /proc/self/status; \
             touch /tmp/mine && echo tmp=ok",
        ),
    );
    h.write(&ghost, &pod_with(&ghost, &format!("  securityContext: {{runAsUserName: {unknown}}}\n"), "true"));
    h.start_agent();

    let done = |v: &Value, stem: &str| {
        let phase = &v["pods"][format!("static/{stem}")]["phase"];
        phase == "Succeeded" || phase == "Failed"
    };
    let v = h.wait("all three finished", |v| [&ids, &named, &ghost].iter().all(|s| done(v, s)));
    let log = h.wait_log(&ids, "the probe", |l| l.contains("shadow="));
    println!("{ids}:\n{log}");
    assert_eq!(v["pods"][format!("static/{ids}")]["phase"], "Succeeded", "{v:#}");
    let first = log.lines().next().unwrap_or("");
    let groups: Vec<&str> = first.split("groups=").nth(1).unwrap_or("").split(' ').collect();
    assert!(first.starts_with("uid=1001 gid=1001 groups="), "{log}");
    assert!(groups.contains(&"1002") && !groups.contains(&"0"), "supplementary groups, never root's: {log}");
    assert!(log.contains("CapEff:\t0000000000000000\n"), "{log}");
    assert!(log.contains("/etc/shadow: Permission denied") && log.contains("shadow=1"), "{log}");
    assert!(!log.contains("root:"), "not a line of /etc/shadow: {log}");

    let log = h.wait_log(&named, "the probe", |l| l.contains("tmp="));
    println!("{named}:\n{log}");
    assert_eq!(v["pods"][format!("static/{named}")]["phase"], "Succeeded", "{v:#}");
    let (uid, gid) = (host_id("-u", "nobody"), host_id("-g", "nobody"));
    let home = std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("nobody:").and_then(|rest| rest.split(':').nth(4)).map(str::to_string))
        .unwrap();
    assert!(log.contains(&format!("uid={uid} gid={gid} home={home}\n")), "{log}");
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert!(log.contains(&format!("{set}:\t0000000000000000\n")), "{set}: {log}");
    }
    assert!(log.contains("tmp=ok"), "its /tmp is writable: {log}");

    let p = &v["pods"][format!("static/{ghost}")];
    println!("{ghost}: {}", p["message"]);
    assert_eq!(p["phase"], "Failed", "{p:#}");
    assert_eq!(p["containerStatuses"][0]["reason"], "StartError", "{p:#}");
    let message = p["message"].as_str().unwrap_or("");
    assert!(message.contains(&format!("runAsUserName \"{unknown}\": no such user on this node")), "{message:?}");
    assert!(h.container_ids(&ghost).is_empty(), "nothing left of {ghost}");

    for stem in [&ids, &named, &ghost] {
        std::fs::remove_file(h.manifests.join(format!("{stem}.yaml"))).unwrap();
    }
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
    let tag = pid.to_string();
    assert_eq!(cgroups(&tag), Vec::<PathBuf>::new());
    assert_eq!(processes(&tag), Vec::<i32>::new());
    assert_eq!(mounts(&h.data), 0, "no mount left");
}

/// A pod of one container running `script` under `sh -c`, with `probes`
/// (YAML lines of the container, indented by four spaces) and `policy`.
fn probed_pod(name: &str, policy: &str, script: &str, probes: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: {policy}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, '{script}']\n    resources: {{requests: {{cpu: '0'}}, limits: {{cpu: 500m, memory: 64Mi}}}}\n{probes}"
    )
}

fn ready_of(v: &Value, key: &str) -> (Option<bool>, Option<String>) {
    let pod = &v["pods"][key];
    // `ready: false` is left out of the JSON.
    let ready = pod["containerStatuses"][0].as_object().map(|c| c.get("ready").and_then(Value::as_bool) == Some(true));
    let cond = pod["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str().map(str::to_string));
    (ready, cond)
}

/// Issue 29: an exec readiness probe that fails until a file exists keeps
/// the container and its pod not ready, then flips both to ready, with the
/// transition's time; a readiness failure never restarts. An HTTP readiness
/// probe reaches a server on a pod with `lo` only (the agent joins its
/// network namespace), and a TCP probe of a closed port keeps its pod not ready.
#[test]
fn readiness_probes_flip_the_pods_ready_condition() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let (file, web, closed) = (format!("ready-{pid}"), format!("web-{pid}"), format!("closed-{pid}"));
    let every_second = "      periodSeconds: 1\n      failureThreshold: 1\n";
    h.write(
        &file,
        &probed_pod(
            &file,
            "Always",
            "sleep 4; touch /tmp/ready; exec sleep 1000",
            &format!("    readinessProbe:\n      exec: {{command: [test, -f, /tmp/ready]}}\n{every_second}"),
        ),
    );
    h.write(
        &web,
        &probed_pod(
            &web,
            "Always",
            "mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec busybox httpd -f -p 18080 -h /tmp/www",
            &format!("    readinessProbe:\n      httpGet: {{port: 18080, path: /index.html}}\n{every_second}"),
        ),
    );
    h.write(
        &closed,
        &probed_pod(
            &closed,
            "Always",
            "exec sleep 1000",
            &format!("    readinessProbe:\n      tcpSocket: {{port: 18081}}\n{every_second}"),
        ),
    );
    h.start_agent();
    let (kf, kw, kc) = (format!("static/{file}"), format!("static/{web}"), format!("static/{closed}"));
    let v = h.wait("the file pod running", |v| v["pods"][&kf]["containerStatuses"][0]["state"] == "Running");
    assert_eq!(ready_of(&v, &kf), (Some(false), Some("False".into())), "not ready before the file: {v:#}");
    let v = h.wait("the file pod ready", |v| ready_of(v, &kf).1.as_deref() == Some("True"));
    assert_eq!(ready_of(&v, &kf).0, Some(true));
    let since = v["pods"][&kf]["conditions"][0]["lastTransitionTime"].as_u64().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert!(since <= now && since + 30 >= now, "transition time {since}, now {now}");
    assert_eq!(v["pods"][&kf]["containerStatuses"][0]["restartCount"], 0, "readiness never restarts");
    let v = h.wait("the web pod ready", |v| ready_of(v, &kw).1.as_deref() == Some("True"));
    // The closed port's pod has been probed several times by now.
    let (ready, cond) = ready_of(&v, &kc);
    assert_eq!((ready, cond.as_deref()), (Some(false), Some("False")), "{v:#}");
    assert_eq!(v["pods"][&kc]["containerStatuses"][0]["state"], "Running");
    for stem in [&file, &web, &closed] {
        std::fs::remove_file(h.manifests.join(format!("{stem}.yaml"))).unwrap();
    }
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
}

/// Issue 29: an exec liveness probe that fails restarts the container
/// through the restart policy (restart count 1), and the pod says why.
#[test]
fn a_failing_liveness_probe_restarts_the_container() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let name = format!("live-{pid}");
    h.write(
        &name,
        &probed_pod(
            &name,
            "Always",
            "exec sleep 1000",
            "    livenessProbe:\n      exec: {command: [test, -f, /tmp/alive]}\n      periodSeconds: 1\n      failureThreshold: 2\n",
        ),
    );
    h.start_agent();
    let key = format!("static/{name}");
    let v = h.wait("a restart", |v| v["pods"][&key]["containerStatuses"][0]["restartCount"].as_u64() >= Some(1));
    let msg = v["pods"][&key]["message"].as_str().unwrap_or_default().to_string();
    assert!(msg.contains("Liveness probe failed"), "{v:#}");
    assert!(msg.contains("exited with 1"), "{v:#}");
    std::fs::remove_file(h.manifests.join(format!("{name}.yaml"))).unwrap();
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
}

/// Issue 29: an exec probe of a pod pinned to CPU 1 runs on the reserved
/// CPU 0 (never on the pod's), inside the container (it sees its /tmp). The
/// probe renames its file into place: the container must never read it empty.
#[test]
fn an_exec_probe_runs_on_the_reserved_cpus_not_the_pods() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pid = std::process::id();
    let name = format!("pinned-probe-{pid}");
    let yaml = format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    rootfs: host\n    command: [sh, -c, 'grep Cpus_allowed_list /proc/self/status; while ! test -f /tmp/probe-cpus; do sleep 0.2; done; sed s/^/probe-/ /tmp/probe-cpus; exec sleep 1000']\n    resources: {{limits: {{cpu: \"1\", memory: 64Mi}}}}\n    readinessProbe:\n      exec: {{command: [sh, -c, \"grep Cpus_allowed_list /proc/self/status > /tmp/probe-cpus.t && mv /tmp/probe-cpus.t /tmp/probe-cpus\"]}}\n      periodSeconds: 1\n"
    );
    h.write(&name, &yaml);
    h.start_agent();
    let key = format!("static/{name}");
    h.wait("ready", |v| ready_of(v, &key).1.as_deref() == Some("True"));
    let log = h.wait_log(&name, "the probe's CPUs", |l| l.contains("probe-Cpus_allowed_list"));
    let line = |prefix: &str| {
        log.lines().find(|l| l.starts_with(prefix)).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
    };
    assert_eq!(line("Cpus_allowed_list").as_deref(), Some("1"), "the container: {log}");
    assert_eq!(line("probe-Cpus_allowed_list").as_deref(), Some("0"), "its probe: {log}");
    std::fs::remove_file(h.manifests.join(format!("{name}.yaml"))).unwrap();
    h.wait("gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    h.signal_agent("TERM");
}

/// The host files a tuned pod on CPU 1 changes, and their content (`None`:
/// the file is absent).
fn tuned_files() -> std::collections::BTreeMap<PathBuf, Option<String>> {
    let mut files = vec![PathBuf::from("/proc/irq/default_smp_affinity"), PathBuf::from("/etc/default/irqbalance")];
    let mut irqs: Vec<PathBuf> = std::fs::read_dir("/proc/irq")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("smp_affinity"))
        .filter(|p| p.exists())
        .collect();
    irqs.sort();
    files.extend(irqs);
    for f in ["power/pm_qos_resume_latency_us", "cpufreq/scaling_governor"] {
        files.push(Path::new("/sys/devices/system/cpu/cpu1").join(f));
    }
    files.into_iter().map(|f| (f.clone(), std::fs::read_to_string(&f).ok().map(|s| s.trim().to_string()))).collect()
}

fn allows_cpu_1(mask: &str) -> bool {
    specs::CpuSet::parse_mask(mask).is_ok_and(|m| m.contains(1))
}

/// A pod on CPU 1 with every tuning this host supports: the files checked
/// from outside while it runs, and equal to before once it is gone, by a
/// delete and by an agent started after a kill -9.
#[test]
fn a_tuned_pod_quiets_cpu_1_and_gives_everything_back() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    let pm_qos = Path::new("/sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us");
    let cpufreq = Path::new("/sys/devices/system/cpu/cpu1/cpufreq/scaling_available_governors");
    let mut tuning = "irqLoadBalancing: disabled, cpuQuota: disabled, cpuLoadBalancing: disabled".to_string();
    if pm_qos.exists() {
        tuning.push_str(", cpuCStates: disabled");
    } else {
        eprintln!("skipping cpuCStates: this host has no {}", pm_qos.display());
    }
    // The governor CPU 1 does not run now, so that a change shows.
    let governor = std::fs::read_to_string(cpufreq).ok().and_then(|list| {
        let now = std::fs::read_to_string(cpufreq.with_file_name("scaling_governor")).unwrap_or_default();
        list.split_whitespace().find(|g| *g != now.trim()).map(str::to_string)
    });
    match &governor {
        Some(g) => tuning.push_str(&format!(", cpuFreqGovernor: {g}")),
        None => eprintln!("skipping cpuFreqGovernor: this host has no cpufreq on CPU 1 (or one governor)"),
    }
    if !Path::new("/proc/irq").exists() {
        eprintln!("skipping the interrupt checks: this host has no /proc/irq");
    }
    let before = tuned_files();
    let name = format!("tuned-{}", std::process::id());
    let manifest = format!("{}  tuning: {{{tuning}}}\n", pod(&name, "1", SHOW_AND_SLEEP, "Always"));
    let key = format!("static/{name}");
    for kill_9 in [false, true] {
        h.write(&name, &manifest);
        h.start_agent();
        h.wait("the tuned pod running on CPU 1", |v| {
            v["pods"][&key]["phase"] == "Running"
                && v["pods"][&key]["placement"]["containers"][0]["cpus"] == serde_json::json!([1])
        });
        // Tuned just after the start: the C-state file is the last one written.
        let deadline = Instant::now() + Duration::from_secs(30);
        let tuned = |v: &Value| v["pods"][&key]["reason"] == "TuningIncomplete" || !pm_qos.exists();
        let mut v = h.status().unwrap();
        while !(tuned(&v) && (!pm_qos.exists() || std::fs::read_to_string(pm_qos).unwrap().trim() == "n/a")) {
            assert!(Instant::now() < deadline, "not tuned: {v:#?}");
            std::thread::sleep(Duration::from_millis(50));
            v = h.status().unwrap();
        }
        let message = v["pods"][&key]["message"].as_str().unwrap_or("").to_string();
        let now = tuned_files();
        for (file, was) in &before {
            let (Some(was), Some(is)) = (was, &now[file]) else { continue };
            let f = file.display().to_string();
            if f.starts_with("/proc/irq/") && allows_cpu_1(was) {
                let irq = f.trim_start_matches("/proc/irq/").trim_end_matches("/smp_affinity");
                let name = if irq == "default_smp_affinity" { "default" } else { irq };
                // Moved off CPU 1, or kept with the reason in the pod's status.
                assert!(
                    !allows_cpu_1(is)
                        || message.contains(&format!("interrupt {name} "))
                        || message.contains(&format!("interrupt {name}:")),
                    "{f}: {was} -> {is}; status: {message}"
                );
            }
        }
        if let Some(old) = &before[&PathBuf::from("/proc/irq/default_smp_affinity")] {
            if allows_cpu_1(old) && specs::CpuSet::parse_mask(old).is_ok_and(|m| m.len() > 1) {
                let is = now[&PathBuf::from("/proc/irq/default_smp_affinity")].clone().unwrap();
                assert!(!allows_cpu_1(&is), "default_smp_affinity {old} -> {is}");
            }
        }
        if let Some(g) = &governor {
            assert_eq!(std::fs::read_to_string(cpufreq.with_file_name("scaling_governor")).unwrap().trim(), g);
        }
        let id = h.container_ids(&name).pop().unwrap();
        let quota = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/pinion/{id}/cpu.cfs_quota_us"))
            .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/pinion/{id}/cpu.max")))
            .unwrap();
        assert!(["-1", "max"].contains(&quota.split_whitespace().next().unwrap()), "quota {quota}");
        let balance = cgroup_file(&id, "cpuset.sched_load_balance");
        if !balance.is_empty() {
            assert_eq!(balance, "0");
        }
        if kill_9 {
            // Killed with the pod tuned, the pod deleted meanwhile: the next
            // agent stops it and gives everything back.
            h.signal_agent("KILL");
            std::fs::remove_file(h.manifests.join(format!("{name}.yaml"))).unwrap();
            h.start_agent();
        } else {
            std::fs::remove_file(h.manifests.join(format!("{name}.yaml"))).unwrap();
        }
        h.wait("the tuned pod gone", |v| v["pods"][&key].is_null());
        let deadline = Instant::now() + Duration::from_secs(30);
        while tuned_files() != before {
            assert!(
                Instant::now() < deadline,
                "not given back (kill -9: {kill_9}):\n{:#?}\nwas\n{before:#?}",
                tuned_files()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<_> = std::fs::read_dir(h.data.join("tuning")).unwrap().flatten().map(|e| e.path()).collect();
        assert_eq!(left, Vec::<PathBuf>::new(), "no record left");
        h.signal_agent("TERM");
    }
}

/// A pod with `SYS_NICE` on a kernel with real-time group scheduling (the
/// v1 cpu controller has `cpu.rt_runtime_us`, as here) gets a budget, so
/// its `chrt -f` works; without one it fails with EPERM. The budgets go
/// back with the pod.
#[test]
fn a_sys_nice_pod_gets_a_real_time_budget() {
    let _host = HOST.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut h) = host() else { return };
    if !Path::new("/sys/fs/cgroup/cpu/cpu.rt_runtime_us").exists() {
        eprintln!("skipping: this host's cpu controller has no cpu.rt_runtime_us (no real-time group scheduling)");
        return;
    }
    let pid = std::process::id();
    let script = "chrt -f 10 true && echo FIFO-OK || echo FIFO-REFUSED; exec sleep 1000";
    let rt = format!("rt-{pid}");
    let nice = "\n    securityContext: {capabilities: {add: [SYS_NICE]}}\n";
    let manifest = pod(&rt, "500m", script, "Always").trim_end().to_string() + nice;
    h.write(&rt, &manifest);
    // The same without SYS_NICE: refused, by the capability check.
    let plain = format!("plain-{pid}");
    h.write(&plain, &pod(&plain, "500m", script, "Always"));
    h.start_agent();
    h.wait_log(&rt, "FIFO-OK", |l| l.contains("FIFO-"));
    assert_eq!(h.log(&rt).trim(), "FIFO-OK", "{}", h.agent_log());
    h.wait_log(&plain, "FIFO-REFUSED", |l| l.contains("FIFO-"));
    let id = h.container_ids(&rt).pop().unwrap();
    let budget = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/pinion/{id}/cpu.rt_runtime_us")).unwrap();
    assert_eq!(budget.trim(), nodelet::tuning::RT_BUDGET_US.to_string());
    for stem in [&rt, &plain] {
        std::fs::remove_file(h.manifests.join(format!("{stem}.yaml"))).unwrap();
    }
    h.wait("both gone", |v| v["pods"].as_object().is_some_and(|p| p.is_empty()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(h.data.join("tuning")).unwrap().next().is_some() {
        assert!(Instant::now() < deadline, "records left");
        std::thread::sleep(Duration::from_millis(50));
    }
    h.signal_agent("TERM");
}
