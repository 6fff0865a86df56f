//! Real containers through the libcontainer runtime, with the `pinion` binary as
//! the shim. Needs root (this machine and CI run as root): without it the tests
//! skip, except under `CI=true` where they fail. Each test uses ids made of its
//! name and the pid, and checks afterwards that no cgroup, mount or process of
//! its containers is left.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use layers::{file, gzip, layer_tar, shell_files, write_layout, Item};
use nodelet::runtime::libcontainer::records::ProcId;
use nodelet::runtime::libcontainer::LibcontainerRuntime;
use nodelet::runtime::{ContainerConfig, ContainerState, CpuQuota, RootfsConfig, Runtime};

#[path = "common/layers.rs"]
mod layers;
#[path = "common/registry.rs"]
mod registry;

const SHIM: &str = env!("CARGO_BIN_EXE_pinion");

struct Fixture {
    dir: tempfile::TempDir,
    /// The runtime's data dir, in `dir`, which is 0755 as `/var/lib` is: only
    /// the data dir itself may keep other users out.
    data: PathBuf,
    rt: LibcontainerRuntime,
    ids: Vec<String>,
}

/// `None` (skip) when not root, outside CI.
fn fixture() -> Option<Fixture> {
    if !pinion_wire::testing::requires_root() {
        return None;
    }
    let dir = tempfile::Builder::new().prefix("pinion-rt-").tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let data = dir.path().join("data");
    let rt = LibcontainerRuntime::new(&data, Path::new(SHIM)).expect("runtime");
    Some(Fixture { dir, data, rt, ids: Vec::new() })
}

impl Fixture {
    fn cfg(&mut self, test: &str, args: &[&str]) -> ContainerConfig {
        let id = format!("{test}-{}-{}", std::process::id(), self.ids.len());
        self.ids.push(id.clone());
        ContainerConfig {
            mounts: Vec::new(),
            pids_limit: None,
            realtime_budget_us: None,
            id: id.clone(),
            pod: test.replace('_', "-"),
            container: "main".into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![("PINION_TEST".into(), "1".into())],
            cwd: "/".into(),
            rootfs: RootfsConfig::Host,
            cpus: "1".parse().expect("cpus"),
            mems: "0".parse().expect("mems"),
            bind_memory: true,
            memory_limit_bytes: Some(256 << 20),
            cpu_quota: None,
            cpu_shares: None,
            hugepage_limits: BTreeMap::new(),
            device_nodes: vec![],
            host_network: false,
            netns: None,
            cap_add: vec![],
            cap_drop: vec![],
            system_cpus: Default::default(),
            log_path: self.data.join("logs").join(format!("{id}.log")),
            init: false,
            run_as: Default::default(),
            userns: None,
            output: None,
        }
    }

    fn log(&self, cfg: &ContainerConfig) -> String {
        std::fs::read_to_string(&cfg.log_path).unwrap_or_default()
    }

    /// Waits up to 20 s for the log to satisfy `pred`.
    fn wait_log(&self, cfg: &ContainerConfig, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log(cfg);
            if pred(&log) || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_exit(&self, id: &str) -> ContainerState {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.rt.state(id).expect("state");
            if !matches!(st, ContainerState::Running { .. }) || Instant::now() > deadline {
                return st;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Removes every container and asserts nothing of them is left.
    fn finish(mut self) {
        for id in std::mem::take(&mut self.ids) {
            self.rt.remove(&id).expect("remove");
            // Idempotent.
            self.rt.remove(&id).expect("second remove");
            assert_eq!(self.rt.state(&id).expect("state"), ContainerState::Missing);
            assert_eq!(self.rt.cgroup_dirs(&id), Vec::<PathBuf>::new(), "cgroups left for {id}");
            assert_eq!(processes_in(&id), Vec::<i32>::new(), "processes left for {id}");
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = self.dir.path().to_string_lossy().to_string();
        assert!(!mounts.contains(&root), "mounts left under {root}");
        assert_eq!(self.rt.list().expect("list"), Vec::<String>::new());
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // On a failed assertion: still clean up.
        for id in &self.ids {
            let _ = self.rt.remove(id);
        }
    }
}

/// Processes whose cgroup path names this container.
fn processes_in(id: &str) -> Vec<i32> {
    let needle = format!("/pinion/{id}");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
                .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&needle)))
                .collect()
        })
        .unwrap_or_default()
}

fn cpuset_file(id: &str, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/cpuset/pinion/{id}/{file}"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/pinion/{id}/{file}.effective")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A CPU controller file of the container's cgroup (v1, else v2's `cpu.max`).
fn cpu_file(id: &str, file: &str) -> String {
    std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/pinion/{id}/{file}"))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/pinion/{id}/cpu.max")))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The start's steps reach the agent: the runtime's own and the shim's (a
/// separate process, whose stamps come in its report), in the order a start
/// passes them, on one clock.
#[test]
fn a_start_traces_the_runtimes_and_the_shims_steps() {
    use nodelet::metrics::{StartTrace, Step};
    let Some(mut fx) = fixture() else { return };
    let cfg = fx.cfg("trace", &["true"]);
    let mut trace = StartTrace::begin();
    fx.rt.start(&cfg, &mut trace).expect("start");
    fx.wait_exit(&cfg.id);
    let steps: Vec<Step> = trace.steps().map(|(s, _)| s).collect();
    let expected = [
        Step::BundlePrepared,
        Step::ShimSpawned,
        Step::ShimRunning,
        Step::ContainerBuilt,
        Step::ContainerStarted,
        Step::ShimReported,
    ];
    assert_eq!(steps, expected);
    // One clock: a stamp from another (the wall clock, the shim's own start)
    // would make a step of zero (before the one before) or of hours.
    for (step, seconds) in trace.steps() {
        assert!(seconds > 0.0 && seconds < 30.0, "{step:?}: {seconds} s");
    }
}

/// The agent makes the pod's network while the runtime prepares the bundle:
/// the container's process waits for it (`NetworkReady` between the bundle
/// and the shim), and a network that failed abandons the start with nothing
/// left behind (no state, cgroup, mount or process).
#[test]
fn a_start_waits_for_its_network_and_a_failed_one_leaves_nothing() {
    use nodelet::metrics::{StartTrace, Step};
    let Some(mut fx) = fixture() else { return };
    let cfg = fx.cfg("gated", &["true"]);
    let mut trace = StartTrace::begin();
    let mut asked = 0;
    let mut ready = || {
        asked += 1;
        std::thread::sleep(std::time::Duration::from_millis(200));
        true
    };
    fx.rt.start_when_ready(&cfg, &mut trace, &mut ready).expect("start");
    assert_eq!(asked, 1, "the gate is asked once");
    fx.wait_exit(&cfg.id);
    let steps: Vec<(Step, f64)> = trace.steps().collect();
    let names: Vec<Step> = steps.iter().map(|(s, _)| *s).collect();
    assert_eq!(&names[..3], &[Step::BundlePrepared, Step::NetworkReady, Step::ShimSpawned], "{names:?}");
    assert!(steps[1].1 >= 0.2, "the shim did not wait for the network: {steps:?}");

    let failed = fx.cfg("abandoned", &["true"]);
    let err = fx.rt.start_when_ready(&failed, &mut StartTrace::begin(), &mut || false).expect_err("abandoned");
    assert!(err.to_string().contains(nodelet::runtime::ABANDONED), "{err}");
    assert_eq!(fx.rt.state(&failed.id).expect("state"), ContainerState::Missing);
    assert_eq!(fx.rt.cgroup_dirs(&failed.id), Vec::<PathBuf>::new(), "cgroups left by an abandoned start");
    assert_eq!(processes_in(&failed.id), Vec::<i32>::new());
    fx.finish();
}

#[test]
fn the_cpu_quota_is_in_place_once_the_container_runs() {
    let Some(mut fx) = fixture() else { return };
    let mut cfg = fx.cfg("quota", &["sh", "-c", "echo up; exec sleep 60"]);
    cfg.cpu_quota = Some(CpuQuota { quota_us: 10_000, period_us: 100_000 });
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    // The shim sets it between create and start: start() returning means the
    // container's process runs, so it must be there already.
    let quota = cpu_file(&cfg.id, "cpu.cfs_quota_us");
    assert!(quota == "10000" || quota == "10000 100000", "quota {quota:?}");
    let period = cpu_file(&cfg.id, "cpu.cfs_period_us");
    assert!(period == "100000" || period == "10000 100000", "period {period:?}");
    assert!(fx.wait_log(&cfg, |l| l.contains("up")).contains("up"));
    fx.finish();
}

#[test]
fn pinned_container_sees_its_cpuset_and_its_exit_code_survives_a_restart() {
    let Some(mut fx) = fixture() else { return };
    let cfg = fx.cfg(
        "pinned",
        &[
            "sh",
            "-c",
            "grep -E 'Cpus_allowed_list|Mems_allowed_list|Seccomp:|NoNewPrivs|CapBnd' /proc/self/status; \
             echo bound: $(grep -c ' bind:0 ' /proc/self/numa_maps); touch /usr/x 2>/dev/null || echo usr-ro; \
             touch /tmp/x && echo tmp-rw; sleep 0.3; exit 7",
        ],
    );
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert!(matches!(fx.rt.state(&cfg.id).expect("state"), ContainerState::Running { .. }));
    assert_eq!(cpuset_file(&cfg.id, "cpuset.cpus"), "1");
    assert_eq!(cpuset_file(&cfg.id, "cpuset.mems"), "0");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 7, oom_killed: false });
    let log = fx.log(&cfg);
    assert!(log.contains("Cpus_allowed_list:\t1\n"), "{log}");
    assert!(log.contains("Mems_allowed_list:\t0\n"), "{log}");
    // Default seccomp filter, no_new_privs, Docker's 14 capabilities.
    for want in ["Seccomp:\t2\n", "NoNewPrivs:\t1\n", "CapBnd:\t00000000a80425fb\n", "usr-ro\n", "tmp-rw\n"] {
        assert!(log.contains(want), "{want:?} missing from {log}");
    }
    // MPOL_BIND on node 0: numa_maps shows `bind:0` on the mappings.
    let bound = log.lines().find_map(|l| l.strip_prefix("bound: ")).and_then(|n| n.trim().parse::<u32>().ok());
    assert!(bound.is_some_and(|n| n > 0), "no mapping bound to node 0: {log}");
    // A new runtime instance (the agent restarted) still knows the exit code.
    let again = LibcontainerRuntime::new(&fx.data, Path::new(SHIM)).expect("runtime");
    assert_eq!(again.state(&cfg.id).expect("state"), ContainerState::Exited { code: 7, oom_killed: false });
    assert_eq!(again.list().expect("list"), vec![cfg.id.clone()]);
    fx.finish();
}

/// clone(CLONE_NEWNS | SIGCHLD) from Python: `ns-clone RC ERRNO`. Docker's
/// profile allows clone only without namespace flags.
const NS_CLONE: &str = "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
     print(\"ns-clone\", l.syscall(56, 0x00020000 | 17, 0, 0, 0, 0), ctypes.get_errno(), flush=True)'";

#[test]
fn the_seccomp_program_is_compiled_ahead_and_holds_the_container_and_its_execs() {
    let Some(mut fx) = fixture() else { return };
    let script = format!("grep Seccomp: /proc/self/status; {NS_CLONE}; sleep 1000");
    let cfg = fx.cfg("filtered", &["sh", "-c", &script]);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    let log = fx.wait_log(&cfg, |l| l.contains("ns-clone"));
    assert!(log.contains("Seccomp:\t2\n"), "{log}");
    assert!(log.contains("ns-clone -1 1\n"), "a namespace clone is refused with EPERM: {log}");
    // The bundle holds the program; the spec libcontainer reads names it
    // instead of carrying the profile.
    let bundle = fx.data.join("containers").join(&cfg.id).join("bundle");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).expect("config.json")).expect("json");
    assert_eq!(spec.pointer("/linux/seccomp"), None);
    assert_eq!(spec.pointer("/annotations/pinion.io~1seccomp-filter"), Some(&"seccomp.bpf".into()));
    let program = std::fs::metadata(bundle.join("seccomp.bpf")).expect("seccomp.bpf");
    assert!(program.len() > 0 && program.len().is_multiple_of(8), "{} bytes", program.len());
    assert_eq!(program.permissions().mode() & 0o777, 0o600);
    // An exec'd command is held to the same program.
    let argv = ["sh".to_string(), "-c".to_string(), format!("grep Seccomp: /proc/self/status; {NS_CLONE}")];
    let p = fx.rt.exec(&cfg.id, &argv).expect("exec");
    let out = read_all(p.stdout);
    assert_eq!((p.wait)().expect("wait"), 0);
    let out = out.recv_timeout(PIPE_END).expect("stdout ends");
    assert!(out.contains("Seccomp:\t2\n") && out.contains("ns-clone -1 1\n"), "exec: {out}");
    fx.rt.stop(&cfg.id, Duration::from_secs(1)).expect("stop");
    fx.finish();
}

#[test]
fn cpuset_is_updated_in_place_and_a_running_container_is_adopted() {
    let Some(mut fx) = fixture() else { return };
    let cfg = fx.cfg("update", &["sh", "-c", "while true; do grep Cpus_allowed_list /proc/1/status; sleep 0.05; done"]);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    let ContainerState::Running { pid } = fx.rt.state(&cfg.id).expect("state") else { panic!("not running") };
    let last = |log: &str| log.lines().last().unwrap_or("").to_string();
    let log = fx.wait_log(&cfg, |l| last(l) == "Cpus_allowed_list:\t1");
    assert_eq!(last(&log), "Cpus_allowed_list:\t1");
    for (cpus, want) in [("0", "0"), ("0-1", "0-1"), ("1", "1")] {
        fx.rt.update_cpuset(&cfg.id, &cpus.parse().expect("cpus"), &"0".parse().expect("mems")).expect("update");
        let log = fx.wait_log(&cfg, |l| last(l) == format!("Cpus_allowed_list:\t{want}"));
        assert_eq!(last(&log), format!("Cpus_allowed_list:\t{want}"));
        assert_eq!(cpuset_file(&cfg.id, "cpuset.cpus"), want);
    }
    // The agent restarts: a new instance adopts the same process.
    let again = LibcontainerRuntime::new(&fx.data, Path::new(SHIM)).expect("runtime");
    assert_eq!(again.state(&cfg.id).expect("state"), ContainerState::Running { pid });
    // `sh` as pid 1 ignores SIGTERM: stop escalates to SIGKILL after the grace.
    again.stop(&cfg.id, Duration::from_millis(200)).expect("stop");
    assert_eq!(again.state(&cfg.id).expect("state"), ContainerState::Exited { code: 137, oom_killed: false });
    fx.finish();
}

#[test]
fn memory_limit_is_enforced_by_the_oom_killer() {
    let Some(mut fx) = fixture() else { return };
    let mut cfg = fx.cfg("oom", &["tail", "/dev/zero"]);
    cfg.memory_limit_bytes = Some(32 << 20);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 137, oom_killed: true });
    fx.finish();
}

/// `CapEff` of the container's shell, as a bit mask.
fn cap_eff(log: &str) -> u64 {
    log.lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no CapEff in {log}"))
}

#[test]
fn added_capabilities_are_granted_with_their_syscalls_and_dropped_ones_are_gone() {
    let Some(mut fx) = fixture() else { return };
    const NET_RAW: u64 = 1 << 13;
    const IPC_LOCK: u64 = 1 << 14;
    const SYS_NICE: u64 = 1 << 23;
    // renice below 0 needs CAP_SYS_NICE; numactl --membind calls set_mempolicy,
    // which the default seccomp profile allows only with it.
    let probe = "grep -E \"Cap(Eff|Inh)\" /proc/self/status; renice -n -5 -p $$ >/dev/null 2>&1 && echo renice: ok || echo renice: refused; \
                 numactl --membind=0 true 2>/dev/null && echo membind: ok || echo membind: refused";
    let plain = fx.cfg("caps-default", &["sh", "-c", probe]);
    let mut more = fx.cfg("caps-added", &["sh", "-c", probe]);
    more.cap_add = vec!["CAP_SYS_NICE".into(), "CAP_IPC_LOCK".into()];
    more.cap_drop = vec!["CAP_NET_RAW".into()];
    // Every capability whose syscalls the profile gates: the filter compiles.
    let mut all = fx.cfg("caps-gated", &["true"]);
    all.cap_drop = vec!["ALL".into()];
    all.cap_add = [
        "DAC_READ_SEARCH",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_MODULE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "SYS_NICE",
        "SYSLOG",
        "BPF",
        "PERFMON",
    ]
    .iter()
    .map(|c| format!("CAP_{c}"))
    .collect();
    for cfg in [&plain, &more, &all] {
        fx.rt.start(cfg, &mut Default::default()).expect("start");
        assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false }, "{}", cfg.id);
    }
    let log = fx.log(&plain);
    assert_eq!(cap_eff(&log) & (NET_RAW | IPC_LOCK | SYS_NICE), NET_RAW, "{log}");
    assert!(log.contains("CapInh:\t0000000000000000"), "no inheritable capabilities: {log}");
    assert!(log.contains("renice: refused") && log.contains("membind: refused"), "{log}");
    let log = fx.log(&more);
    assert_eq!(cap_eff(&log) & (NET_RAW | IPC_LOCK | SYS_NICE), IPC_LOCK | SYS_NICE, "{log}");
    assert!(log.contains("renice: ok") && log.contains("membind: ok"), "{log}");
    fx.finish();
}

#[test]
fn network_namespace_has_only_lo_and_it_is_up() {
    let Some(mut fx) = fixture() else { return };
    let cfg =
        fx.cfg("netns", &["sh", "-c", "echo ifaces: $(ls /sys/class/net); echo flags: $(cat /sys/class/net/lo/flags)"]);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false });
    let log = fx.log(&cfg);
    assert!(log.contains("ifaces: lo\n"), "{log}");
    let flags =
        log.lines().find_map(|l| l.strip_prefix("flags: 0x")).and_then(|f| u32::from_str_radix(f.trim(), 16).ok());
    assert_eq!(flags.map(|f| f & 1), Some(1), "lo is not IFF_UP: {log}");
    fx.finish();
}

#[test]
fn a_failed_start_leaves_nothing_behind() {
    let Some(mut fx) = fixture() else { return };
    let mut bad_cpu = fx.cfg("badstart", &["true"]);
    bad_cpu.cpus = "63".parse().expect("cpus");
    let err = fx.rt.start(&bad_cpu, &mut Default::default()).expect_err("CPU 63 does not exist");
    assert!(err.to_string().contains(&bad_cpu.id), "{err}");
    let mut no_image = fx.cfg("badstart", &["true"]);
    no_image.rootfs = RootfsConfig::Image("nothere:1".into());
    let err = fx.rt.start(&no_image, &mut Default::default()).expect_err("image not imported");
    assert!(err.to_string().contains("not imported"), "{err}");
    let missing = fx.cfg("badstart", &["/no/such/binary"]);
    let res = fx.rt.start(&missing, &mut Default::default()).map(|()| fx.wait_exit(&missing.id));
    // Either refused at start or exited non-zero: never "running".
    assert!(!matches!(res, Ok(ContainerState::Running { .. }) | Ok(ContainerState::Exited { code: 0, .. })), "{res:?}");
    for cfg in [&bad_cpu, &no_image] {
        assert_eq!(fx.rt.state(&cfg.id).expect("state"), ContainerState::Missing);
        assert_eq!(fx.rt.cgroup_dirs(&cfg.id), Vec::<PathBuf>::new());
    }
    fx.finish();
}

#[test]
fn a_half_created_container_whose_shim_died_is_swept_at_startup() {
    let Some(mut fx) = fixture() else { return };
    // A shim that crashes right after libcontainer's build(): the container is
    // left in Created state (bundle, libcontainer state, cgroup, a waiting init)
    // exactly as when shim and agent die together mid-create.
    let wrapper = fx.dir.path().join("crashing-shim");
    std::fs::write(&wrapper, format!("#!/bin/sh\nPINION_SHIM_CRASH_AFTER_BUILD=1 exec {SHIM} \"$@\"\n"))
        .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let crashing = LibcontainerRuntime::new(&fx.data, &wrapper).expect("runtime");
    let cfg = fx.cfg("sweep", &["true"]);
    crashing.start(&cfg, &mut Default::default()).expect("the crashing shim still reports");
    assert!(!fx.rt.cgroup_dirs(&cfg.id).is_empty(), "the half-created container has a cgroup");
    assert!(!processes_in(&cfg.id).is_empty(), "its init waits for start");
    let shim: ProcId = serde_json::from_slice(&std::fs::read(fx.rt.layout().shim(&cfg.id)).expect("shim record"))
        .expect("shim record");
    let deadline = Instant::now() + Duration::from_secs(10);
    while shim.alive() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The agent restarts: the sweep removes it entirely.
    let again = LibcontainerRuntime::new(&fx.data, Path::new(SHIM)).expect("runtime");
    assert_eq!(again.list().expect("list"), Vec::<String>::new());
    assert_eq!(again.cgroup_dirs(&cfg.id), Vec::<PathBuf>::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !processes_in(&cfg.id).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    fx.finish();
}

// ---- images ----

fn pinion(args: &[&str]) -> std::process::Output {
    std::process::Command::new(SHIM).args(args).output().expect("run pinion")
}

#[test]
fn image_built_here_imports_with_whiteouts_and_runs() {
    let Some(mut fx) = fixture() else { return };
    let layout = fx.dir.path().join("layout");
    layered_image(&layout, "testimg:1", true);
    // dash has only builtins here: `echo DIR/*` lists a directory (an empty one
    // prints the pattern itself).
    // As a tar archive of the layout, through the CLI.
    let archive = fx.dir.path().join("layout.tar");
    let status = std::process::Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&archive).arg(".").status();
    assert!(status.is_ok_and(|s| s.success()));
    let data_dir = fx.data.to_string_lossy().to_string();
    let out = pinion(&["image", "import", archive.to_str().expect("path"), "--data-dir", &data_dir]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = pinion(&["image", "list", "--data-dir", &data_dir]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("testimg:1"));

    let mut cfg = fx.cfg("image", &[]);
    cfg.rootfs = RootfsConfig::Image("testimg:1".into());
    cfg.cwd = String::new();
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false });
    let log = fx.log(&cfg);
    assert_eq!(log, LAYERED_OUTPUT, "{log}");
    fx.finish();
}

/// Two layers (the second with a whiteout and an opaque folder) of an image
/// that prints what it sees: the first layer's file, what is left of /etc and
/// /data, its env and its working dir. `gzip`: the first layer gzipped,
/// else both plain (for skopeo to compress as it is told).
fn layered_image(layout: &Path, name: &str, gzipped: bool) {
    let mut l1 = shell_files();
    l1.extend([
        Item::Dir("etc".into()),
        file("etc/removed", b"x"),
        Item::Dir("data".into()),
        file("data/old", b"x"),
        file("hello.txt", b"from layer 1\n"),
    ]);
    let l2 = vec![file("etc/.wh.removed", b""), file("data/.wh..wh..opq", b""), file("data/new", b"y")];
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/sh", "-c"],
                   "Cmd": ["read l < /hello.txt; echo $l; echo etc: /etc/*; echo data: /data/*; echo $GREETING; pwd"],
                   "Env": ["GREETING=hi-from-image", "PATH=/bin"], "WorkingDir": "/data"},
        "rootfs": {"type": "layers", "diff_ids": []},
    });
    write_layout(
        layout,
        &[
            if gzipped {
                (gzip(&layer_tar(&l1)), "application/vnd.oci.image.layer.v1.tar+gzip")
            } else {
                (layer_tar(&l1), "application/vnd.oci.image.layer.v1.tar")
            },
            (layer_tar(&l2), "application/vnd.oci.image.layer.v1.tar"),
        ],
        config,
        name,
    );
}

const LAYERED_OUTPUT: &str = "from layer 1\netc: /etc/*\ndata: /data/new\nhi-from-image\n/data\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_pulled_from_a_registry_run_and_bad_pulls_say_why() {
    use nodelet::registry::{Ensured, PullError, Puller, RegistryConfig};
    use nodelet::runtime::libcontainer::image;
    use specs::pod::PullPolicy;
    if !pinion_wire::testing::requires(
        ["docker-registry", "skopeo", "htpasswd", "openssl"].iter().all(|b| which(b)),
        "docker-registry, skopeo, htpasswd and openssl (e2e/host-setup.sh installs them)",
    ) {
        return;
    }
    let Some(mut fx) = fixture() else { return };
    let (layout, plain) = (fx.dir.path().join("layout"), fx.dir.path().join("plain"));
    layered_image(&layout, "v1", true);
    layered_image(&plain, "v1", false);
    let reg = registry::Registry::plain(&fx.dir.path().join("registry"));
    let upf = reg.push(&layout, "v1", "upf:1.2", None);
    let zstd = reg.push(&plain, "v1", "upf-zstd:1", Some("zstd"));
    let images = fx.data.join("images");
    let mut cfg = RegistryConfig::new(&fx.data);
    cfg.insecure = vec![reg.host.clone()];
    let puller = std::sync::Arc::new(Puller::new(cfg.clone()));

    // Ten pods of one image on a node pull it once.
    let mut pulls = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let (puller, images, upf) = (puller.clone(), images.clone(), upf.clone());
        pulls.spawn(async move { puller.ensure(&images, &upf, PullPolicy::IfNotPresent).await });
    }
    let mut pulled = 0;
    while let Some(r) = pulls.join_next().await {
        if let Ensured::Pulled(rec) = r.expect("task").expect("ensure") {
            assert_eq!(rec.layers, 2);
            pulled += 1;
        }
    }
    assert_eq!((pulled, puller.pulls()), (1, 1), "one pull for ten pods");
    // Present: not pulled again, not even asked.
    let again = puller.ensure(&images, &upf, PullPolicy::IfNotPresent).await.expect("present");
    assert_eq!((again, puller.pulls()), (Ensured::Present, 1));

    // It runs, with the whiteout and the opaque folder applied.
    let mut run = fx.cfg("pulled", &[]);
    run.rootfs = RootfsConfig::Image(upf.clone());
    run.cwd = String::new();
    fx.rt.start(&run, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&run.id), ContainerState::Exited { code: 0, oom_killed: false });
    assert_eq!(fx.log(&run), LAYERED_OUTPUT);

    // zstd layers give the same tree.
    puller.ensure(&images, &zstd, PullPolicy::Always).await.expect("zstd pull");
    let mut run = fx.cfg("zstd", &[]);
    run.rootfs = RootfsConfig::Image(zstd.clone());
    run.cwd = String::new();
    fx.rt.start(&run, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&run.id), ContainerState::Exited { code: 0, oom_killed: false });
    assert_eq!(fx.log(&run), LAYERED_OUTPUT);

    // Pinned: the right digest pulls, a wrong one is refused.
    let digest = reg.digest("upf:1.2");
    let pinned = format!("{}/upf@{digest}", reg.host);
    puller.pull(&images, &pinned).await.expect("the pinned digest");
    let wrong = format!("{}/upf:1.2@sha256:{}", reg.host, "0".repeat(64));
    let e = puller.pull(&images, &wrong).await.expect_err("a wrong digest");
    assert!(matches!(e, PullError::Registry { .. }), "{e}");
    let listed = image::list(&images).expect("list");
    assert!(!listed.iter().any(|i| i.reference == wrong), "nothing stored under a refused pin");

    // A tag that is not there: the registry's own words.
    let e = puller.ensure(&images, &format!("{}/upf:missing", reg.host), PullPolicy::IfNotPresent).await;
    let e = e.expect_err("missing tag").to_string();
    assert!(e.contains("MANIFEST_UNKNOWN"), "{e}");
    // Never: only what is here.
    let e = puller.ensure(&images, &format!("{}/other:1", reg.host), PullPolicy::Never).await;
    assert!(matches!(e, Err(PullError::NeverPull { .. })), "{e:?}");
    // Plain HTTP is spoken only to the registries the node names.
    let strict = Puller::new(RegistryConfig::new(&fx.data));
    let e = strict.pull(&images, &upf).await.expect_err("https to a plain registry").to_string();
    assert!(e.contains("https://"), "{e}");

    // A registry with TLS and a password: refused without them, pulled with
    // auth.json and certs.d as a site writes them.
    let secure = registry::Registry::secure(&fx.dir.path().join("secure"));
    // (Content of its own: the collection below removes it, not the others.)
    let private = secure.push(&plain, "v1", "vendor/du:3", None);
    let e = strict.pull(&images, &private).await.expect_err("an unknown CA").to_string();
    assert!(e.contains("certificate") || e.contains("Certificate"), "{e}");
    let certs = fx.data.join("certs.d").join(&secure.host);
    std::fs::create_dir_all(&certs).expect("certs.d");
    std::fs::copy(secure.ca.as_ref().expect("ca"), certs.join("ca.crt")).expect("ca");
    let e = strict.pull(&images, &private).await.expect_err("no credentials").to_string();
    assert!(e.contains("Not authorized"), "{e}");
    let (user, password) = secure.login.clone().expect("login");
    let auth = base64_of(&format!("{user}:{password}"));
    std::fs::write(
        fx.data.join("auth.json"),
        format!(r#"{{"auths": {{"https://{}": {{"auth": "{auth}"}}}}}}"#, secure.host),
    )
    .expect("auth.json");
    let e = strict.pull(&images, &private).await.expect_err("an auth.json others may read").to_string();
    assert!(e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(fx.data.join("auth.json"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let rec = strict.pull(&images, &private).await.expect("with credentials and the CA");
    assert_eq!(rec.layers, 2);

    // Garbage collection: what no container uses goes, what one uses stays.
    let in_use = image::in_use(&nodelet::runtime::libcontainer::records::Layout::new(&fx.data)).expect("in use");
    assert_eq!(in_use.len(), 2, "the two containers' images: {in_use:?}");
    let removed = image::collect_garbage(&images, &in_use, 0, 0).expect("gc");
    assert!(removed.iter().any(|r| r.contains("vendor/du")), "{removed:?}");
    let left: Vec<String> = image::list(&images).expect("list").into_iter().map(|i| i.reference).collect();
    assert!(left.contains(&upf) && left.contains(&zstd) && !left.contains(&private), "{left:?}");
    fx.finish();
}

fn which(binary: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(binary).is_file()))
}

fn base64_of(text: &str) -> String {
    let out = std::process::Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().map(|mut i| i.write_all(text.as_bytes()));
            c.wait_with_output()
        });
    String::from_utf8_lossy(&out.expect("base64").stdout).trim().to_string()
}

#[test]
fn bad_images_are_refused_with_a_clear_error() {
    let Some(fx) = fixture() else { return };
    let marker = format!("pinion-escape-{}", std::process::id());
    let data_dir = fx.data.to_string_lossy().to_string();
    let check = |name: &str, items: Vec<Item>, expected: &str| {
        let layout = fx.dir.path().join(name);
        let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["true"]}});
        write_layout(&layout, &[(layer_tar(&items), "application/vnd.oci.image.layer.v1.tar")], config, "bad:1");
        let out = pinion(&["image", "import", layout.to_str().expect("path"), "--data-dir", &data_dir]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success() && err.contains(expected), "{name}: {err}");
    };
    check(
        "dotdot",
        vec![Item::RawName(format!("../../../../../../tmp/{marker}"), b"x".to_vec())],
        "escapes the rootfs",
    );
    check(
        "symlink",
        vec![Item::Symlink("esc".into(), format!("../../../../../../tmp/{marker}-dir")), file("esc/pwned", b"x")],
        "points outside the rootfs",
    );
    assert!(!Path::new("/tmp").join(&marker).exists());
    assert!(!Path::new("/tmp").join(format!("{marker}-dir")).exists());
    let out = pinion(&["image", "list", "--data-dir", &data_dir, "-o", "json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    fx.finish();
}

/// Reads a pipe to its end on a thread (the two pipes must drain together);
/// `.recv_timeout` bounds the wait for that end.
fn read_all(fd: std::os::fd::OwnedFd) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut text);
        let _ = tx.send(text);
    });
    rx
}

const PIPE_END: Duration = Duration::from_secs(20);

#[test]
fn exec_runs_in_the_container_and_its_cancel_leaves_nothing() {
    let Some(mut fx) = fixture() else { return };
    let cfg = fx.cfg("exec", &["sleep", "1000"]);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    // Its stdout and stderr apart, the container's CPUs, cgroup, environment
    // and capabilities, its exit code.
    let script = "echo out; echo err >&2; grep -E '^(Cpus_allowed_list|CapBnd)' /proc/self/status; \
                  grep -E '^CapBnd' /proc/1/status | sed s/CapBnd/init/; \
                  cmp -s /proc/1/cgroup /proc/self/cgroup && echo same-cgroup; echo env=$PINION_TEST; exit 3";
    let p = fx.rt.exec(&cfg.id, &argv(&["sh", "-c", script])).expect("exec");
    let (out, err) = (read_all(p.stdout), read_all(p.stderr));
    assert_eq!((p.wait)().expect("wait"), 3);
    let (out, err) =
        (out.recv_timeout(PIPE_END).expect("stdout ends"), err.recv_timeout(PIPE_END).expect("stderr ends"));
    assert_eq!(err, "err\n");
    assert!(out.starts_with("out\n") && out.contains("Cpus_allowed_list:\t1\n"), "{out}");
    assert!(out.contains("same-cgroup\n") && out.contains("env=1\n"), "{out}");
    let cap = |key: &str| out.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).map(str::to_string);
    assert_eq!(cap("CapBnd:"), cap("init:"), "the container's capabilities: {out}");

    // A command that does not exist: 127 before anything is joined.
    match fx.rt.exec(&cfg.id, &argv(&["/no/such"])) {
        Err(nodelet::runtime::RuntimeError::CannotRun { code: 127, .. }) => {}
        Err(e) => panic!("want CannotRun 127, got {e}"),
        Ok(_) => panic!("want CannotRun 127, got a process"),
    }

    // Cancelled (the caller went away): the command and what it started go,
    // the container's own process stays.
    let p = fx.rt.exec(&cfg.id, &argv(&["sh", "-c", "sleep 1000 & sleep 1000"])).expect("exec");
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_in(&cfg.id).len() < 4 {
        assert!(Instant::now() < deadline, "the exec's processes never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (out, err) = (read_all(p.stdout), read_all(p.stderr));
    drop(p.cancel);
    assert_eq!((p.wait)().expect("wait"), 137, "SIGKILL");
    let ends = (out.recv_timeout(PIPE_END), err.recv_timeout(PIPE_END));
    assert_eq!(ends, (Ok(String::new()), Ok(String::new())), "no process holds the output open");
    assert_eq!(processes_in(&cfg.id).len(), 1, "only the container's own process is left");
    assert!(matches!(fx.rt.state(&cfg.id).expect("state"), ContainerState::Running { .. }));
    fx.finish();
}

/// Host binaries and the libraries they link, as image layer entries at
/// their own (canonical) paths.
fn binary_files(binaries: &[&str]) -> Vec<Item> {
    let mut paths = std::collections::BTreeSet::new();
    for b in binaries {
        let exe = std::fs::canonicalize(b).expect("binary");
        let out = std::process::Command::new("ldd").arg(&exe).output().expect("ldd");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let p = line.split("=>").last().unwrap_or("").split_whitespace().next().unwrap_or("");
            if p.starts_with('/') {
                // As ldd names it (the loader's path is written in the binary).
                paths.insert(PathBuf::from(p));
            }
        }
        paths.insert(exe);
    }
    paths
        .iter()
        .map(|p| {
            let inside = p.to_string_lossy().trim_start_matches('/').to_string();
            Item::File(inside, std::fs::read(p).expect("read binary"), 0o755)
        })
        .collect()
}

/// `argv` run as the host user `nobody`. Through `runuser`, not `setpriv
/// --reuid`: setpriv keeps root's capabilities across the uid change (the
/// exec then passes every permission check).
fn as_nobody(argv: &[&str]) -> std::process::Output {
    std::process::Command::new("runuser").args(["-u", "nobody", "--"]).args(argv).output().expect("runuser")
}

/// Issue 25, finding 3: containers run as uid 0, so a setuid file one makes
/// in its root is setuid root on the host, in its overlay's upper folder
/// (and in the merged rootfs while mounted). Neither may be reachable by
/// another host user: the data dir is 0700.
#[test]
fn a_setuid_file_made_in_a_container_is_not_root_for_another_host_user() {
    let Some(mut fx) = fixture() else { return };
    let id_bin = std::fs::canonicalize("/usr/bin/id").expect("id");
    // This host honours setuid where the data dir lives (no nosuid mount):
    // otherwise the test would prove nothing.
    let open = fx.dir.path().join("open-id");
    std::fs::copy(&id_bin, &open).expect("copy id");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o4755)).expect("chmod");
    let out = as_nobody(&[open.to_str().expect("path"), "-u"]);
    let honoured = String::from_utf8_lossy(&out.stdout).trim() == "0";
    if !pinion_wire::testing::requires(honoured, format_args!("setuid honoured under {}", fx.dir.path().display())) {
        return;
    }

    let layout = fx.dir.path().join("suid-layout");
    let items = binary_files(&["/bin/sh", "/bin/cp", "/bin/chmod", "/usr/bin/id"]);
    let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]}});
    write_layout(&layout, &[(layer_tar(&items), "application/vnd.oci.image.layer.v1.tar")], config, "suid:1");
    nodelet::runtime::libcontainer::image::import(&fx.data.join("images"), &layout, None).expect("import");
    let script =
        format!("{} {} /x && {} 4755 /x && echo made", canon("/bin/cp"), id_bin.display(), canon("/bin/chmod"));
    let mut cfg = fx.cfg("suid", &[&canon("/bin/sh"), "-c", &script]);
    cfg.rootfs = RootfsConfig::Image("suid:1".into());
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false }, "{}", fx.log(&cfg));
    let container = fx.data.join("containers").join(&cfg.id);
    for made in [container.join("upper/x"), container.join("bundle/rootfs/x")] {
        let meta = std::fs::metadata(&made).expect("the container's file");
        assert!(meta.permissions().mode() & 0o4000 != 0, "{} is setuid", made.display());
        let out = as_nobody(&[made.to_str().expect("path"), "-u"]);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            !out.status.success() && stdout.trim() != "0",
            "nobody ran {} as uid {stdout} ({stderr})",
            made.display()
        );
        assert!(stderr.contains("Permission denied"), "{stderr}");
    }
    fx.finish();
}

fn canon(path: &str) -> String {
    std::fs::canonicalize(path).expect("path").to_string_lossy().into_owned()
}

/// Issue 25, finding 5: a fork bomb stops at the container's pids limit
/// (`pids.max` of its cgroup) and the host can still fork. The bomb is
/// bounded (300) so that it cannot hurt the host when the limit is missing.
#[test]
fn a_fork_bomb_stops_at_the_pids_limit_and_the_host_is_fine() {
    let Some(mut fx) = fixture() else { return };
    let mut cfg = fx.cfg(
        "forkbomb",
        &["sh", "-c", "i=0; while [ $i -lt 300 ]; do sleep 60 & i=$((i+1)); echo n=$i; done; echo survived"],
    );
    cfg.pids_limit = Some(64);
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    let state = fx.wait_exit(&cfg.id);
    let log = fx.log(&cfg);
    let forked: u32 =
        log.lines().filter_map(|l| l.strip_prefix("n=")).filter_map(|n| n.parse().ok()).max().unwrap_or(0);
    let pids = |file: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/pids/pinion/{}/{file}", cfg.id))
            .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/pinion/{}/{file}", cfg.id)))
            .unwrap_or_default()
    };
    assert_eq!(pids("pids.max").trim(), "64");
    assert!(forked < 64 && !log.contains("survived"), "forked {forked}: {log}");
    assert!(log.contains("Cannot fork") || log.contains("Resource temporarily unavailable"), "{log}");
    assert!(matches!(state, ContainerState::Exited { .. }), "{state:?}");
    let refused: u64 = pids("pids.events")
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(refused > 0, "pids.events counts the refused forks");
    // The host is fine.
    let host = std::process::Command::new("true").status().expect("the host forks");
    assert!(host.success());
    fx.finish();
}

/// Issue 25, finding 3 (hostPath): the pod's host folders are mounted
/// `nosuid,nodev` (a setuid file or a device node there gives nothing inside),
/// and the container's `/tmp` is a tmpfs sized by its memory limit. Read
/// from where it matters: the container's own mountinfo.
#[test]
fn host_paths_are_nosuid_nodev_and_tmp_is_sized() {
    let Some(mut fx) = fixture() else { return };
    let vol = fx.dir.path().join("vol");
    std::fs::create_dir(&vol).expect("vol");
    let mut cfg = fx.cfg("hostpath", &["sh", "-c", "grep -E ' /(vol|tmp) ' /proc/self/mountinfo"]);
    cfg.mounts =
        vec![nodelet::runtime::BindMount { source: vol.clone(), destination: PathBuf::from("/vol"), read_only: false }];
    fx.rt.start(&cfg, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false });
    let log = fx.log(&cfg);
    let line = |target: &str| {
        log.lines()
            .find(|l| l.split(' ').nth(4) == Some(target))
            .unwrap_or_else(|| panic!("{target} is not mounted: {log}"))
            .to_string()
    };
    let vol_line = line("/vol");
    // Field 6: the mount's own options.
    let opts: Vec<&str> = vol_line.split(' ').nth(5).unwrap_or("").split(',').collect();
    assert!(opts.contains(&"nosuid") && opts.contains(&"nodev") && opts.contains(&"rw"), "{vol_line}");
    let tmp_line = line("/tmp");
    // The fixture's memory limit, 256 MiB, in the superblock's options.
    assert!(tmp_line.contains("size=262144k") && tmp_line.contains("nosuid"), "{tmp_line}");
    fx.finish();
}

/// Issue 27: a non-root container holds exactly the capabilities it was
/// given, and they work (an admin's SYS_NICE for a telecom user: renice
/// below 0 and `set_mempolicy`); without one it holds none, in any set. A
/// command exec'd into it is the same user with the same groups.
#[test]
fn a_non_root_container_holds_only_what_it_was_given_and_exec_is_that_user() {
    let Some(mut fx) = fixture() else { return };
    const SYS_NICE: u64 = 1 << 23;
    let probe = "id -u; id -G; grep -E \"^Cap(Inh|Prm|Eff|Bnd|Amb)\" /proc/self/status; \
                 renice -n -5 -p $$ >/dev/null 2>&1 && echo renice: ok || echo renice: refused; \
                 numactl --membind=0 true 2>/dev/null && echo membind: ok || echo membind: refused";
    let user =
        nodelet::runtime::RunAs { uid: Some(1001), gid: Some(1001), supplemental_groups: vec![1002], user_name: None };
    let mut plain = fx.cfg("user-plain", &["sh", "-c", probe]);
    plain.run_as = user.clone();
    let mut nice = fx.cfg("user-nice", &["sh", "-c", probe]);
    nice.run_as = user.clone();
    nice.cap_add = vec!["CAP_SYS_NICE".into()];
    for cfg in [&plain, &nice] {
        fx.rt.start(cfg, &mut Default::default()).expect("start");
        assert_eq!(fx.wait_exit(&cfg.id), ContainerState::Exited { code: 0, oom_killed: false }, "{}", cfg.id);
    }
    let set = |log: &str, key: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("{key} in {log}"))
    };
    let log = fx.log(&plain);
    assert!(log.starts_with("1001\n1001 1002\n"), "{log}");
    for key in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(set(&log, key), 0, "{key} {log}");
    }
    assert!(log.contains("renice: refused") && log.contains("membind: refused"), "{log}");
    let log = fx.log(&nice);
    for key in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(set(&log, key), SYS_NICE, "{key} {log}");
    }
    assert!(log.contains("renice: ok") && log.contains("membind: ok"), "{log}");

    let mut running = fx.cfg("user-exec", &["sleep", "1000"]);
    running.run_as = user;
    fx.rt.start(&running, &mut Default::default()).expect("start");
    let argv = ["sh", "-c", "id -u; id -G; grep ^CapEff /proc/self/status"].map(str::to_string);
    let p = fx.rt.exec(&running.id, &argv).expect("exec");
    let out = read_all(p.stdout);
    assert_eq!((p.wait)().expect("wait"), 0);
    let out = out.recv_timeout(PIPE_END).expect("stdout ends");
    assert_eq!(out, "1001\n1001 1002\nCapEff:\t0000000000000000\n");
    fx.rt.stop(&running.id, Duration::from_secs(1)).expect("stop");
    fx.finish();
}

/// Issue 27: a container that must be root inside runs in a user namespace
/// (`hostUsers: false`): root inside, the pod's block of host ids outside.
/// On a host rootfs it reads what others may read and nothing more (the
/// host's `/etc/shadow` stays closed to it); an image's files, owned by the
/// host's root on disk, are its root's inside (it may change `/etc`), and what
/// it writes is owned on the host by its block, not by root.
#[test]
fn root_in_a_user_namespace_is_nobody_on_the_host() {
    let Some(mut fx) = fixture() else { return };
    let blocks = nodelet::runtime::userns::Blocks::new(&fx.data);
    let probe =
        "cat /proc/self/uid_map; id -u; cat /etc/shadow >/dev/null 2>&1 && echo shadow: read || echo shadow: closed";
    let mut host = fx.cfg("userns-host", &["sh", "-c", probe]);
    let base = blocks.claim(&host.pod).expect("claim");
    host.userns = Some(nodelet::runtime::UserNamespace { sandbox: host.pod.clone(), base, pinned: None });
    fx.rt.start(&host, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&host.id), ContainerState::Exited { code: 0, oom_killed: false }, "{}", fx.log(&host));
    let log = fx.log(&host);
    let map: Vec<&str> = log.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(map, ["0", &base.to_string(), "65536"], "{log}");
    assert!(log.contains("\n0\nshadow: closed\n"), "{log}");

    let layout = fx.dir.path().join("userns-layout");
    let mut items = vec![Item::Dir("etc".into()), file("etc/motd", b"hello\n")];
    items.extend(binary_files(&["/bin/sh", "/usr/bin/id", "/bin/cat", "/bin/touch", "/usr/bin/stat", "/bin/chown"]));
    let config = serde_json::json!({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]}});
    write_layout(&layout, &[(layer_tar(&items), "application/vnd.oci.image.layer.v1.tar")], config, "userns:1");
    nodelet::runtime::libcontainer::image::import(&fx.data.join("images"), &layout, None).expect("import");
    let script =
        "id -u; stat -c %u /etc/motd; touch /etc/made && chown 7:7 /etc/made && echo made; stat -c %u /etc/made";
    let mut image = fx.cfg("userns-image", &[&canon("/bin/sh"), "-c", script]);
    image.rootfs = RootfsConfig::Image("userns:1".into());
    let base = blocks.claim(&image.pod).expect("claim");
    image.userns = Some(nodelet::runtime::UserNamespace { sandbox: image.pod.clone(), base, pinned: None });
    fx.rt.start(&image, &mut Default::default()).expect("start");
    assert_eq!(fx.wait_exit(&image.id), ContainerState::Exited { code: 0, oom_killed: false }, "{}", fx.log(&image));
    assert_eq!(fx.log(&image), "0\n0\nmade\n7\n");
    use std::os::unix::fs::MetadataExt;
    let made = fx.data.join("containers").join(&image.id).join("upper/etc/made");
    let meta = std::fs::metadata(&made).expect("the container's file");
    assert_eq!((meta.uid(), meta.gid()), (base + 7, base + 7), "{}", made.display());
    // The image itself is unchanged: still the host root's.
    let lower = std::fs::metadata(fx.data.join("containers").join(&image.id).join("lower/etc/motd"));
    assert!(lower.is_ok(), "the idmapped layer is mounted while the container exists");
    // An exec joins the container's user namespace: root inside, the same map.
    let mut running = fx.cfg("userns-exec", &["sleep", "1000"]);
    running.userns = host.userns.clone();
    fx.rt.start(&running, &mut Default::default()).expect("start");
    let status = "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status";
    let argv =
        ["sh", "-c", &format!("id -u; cat /proc/self/uid_map; {status}; cat /proc/1/cmdline")].map(str::to_string);
    let p = fx.rt.exec(&running.id, &argv).expect("exec");
    let out = read_all(p.stdout);
    assert_eq!((p.wait)().expect("wait"), 0);
    let out = out.recv_timeout(PIPE_END).expect("stdout ends");
    let base = host.userns.as_ref().map(|n| n.base).unwrap_or_default();
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(words[..4], ["0", "0", &base.to_string(), "65536"], "{out}");
    // As the container's own process: its capabilities, no_new_privs and
    // seccomp filter, in its pid namespace (PID 1 is the container's sleep).
    let ContainerState::Running { pid } = fx.rt.state(&running.id).expect("state") else { panic!("not running") };
    let init = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    for key in ["CapEff:", "CapBnd:", "NoNewPrivs:", "Seccomp:"] {
        let of = |text: &str| text.lines().find(|l| l.starts_with(key)).map(str::to_string);
        assert_eq!(of(&out), of(&init), "{key}: exec {out} init {init}");
    }
    assert!(out.contains("NoNewPrivs:\t1") && out.contains("Seccomp:\t2") && out.contains("sleep"), "{out}");
    fx.rt.stop(&running.id, Duration::from_secs(1)).expect("stop");
    let open = [&host.id, &image.id].map(|id| Path::new(nodelet::runtime::libcontainer::records::POD_ROOTS).join(id));
    assert!(open.iter().all(|p| p.exists()), "the rootfs is open to the pod while it exists");
    fx.finish();
    for p in open {
        assert!(!p.exists(), "{} is left", p.display());
    }
}
