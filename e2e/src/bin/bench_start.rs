//! Container start benchmark: pinion's libcontainer runtime (shim per
//! container) against `crun run` and `runc run` of the same OCI bundle,
//! interleaved, in one private mount namespace (crun 1.8 refuses this host's
//! hybrid cgroups unless `unified/cgroup.controllers` is hidden; every runtime
//! runs in that namespace so none pays for the trick alone).
//!
//! Usage (as root): `bench_start [--runs N] [--pinion PATH]`; installs Debian
//! `crun` and `runc` with apt-get when they are missing. Prints, per runtime,
//! median and p99 of: create -> first stdout byte (pinion's seen in its log
//! file through inotify, `e2e::firstbyte`; the peers' on their stdout pipe),
//! and create+start+exit+delete.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::firstbyte::LogWatch;
use e2e::peers;
use e2e::stats::percentile as pct;
use nodelet::runtime::libcontainer::{rootfs, spec, LibcontainerRuntime};
use nodelet::runtime::{ContainerConfig, ContainerState, RootfsConfig, Runtime};

const POLL: Duration = Duration::from_micros(200);

fn main() -> anyhow::Result<()> {
    let (runs, pinion) = peers::bench_setup()?;

    let work = tempfile::Builder::new().prefix("pinion-bench-").tempdir()?;
    let rt = LibcontainerRuntime::new(&work.path().join("data"), &pinion)?;
    let base = config(work.path(), "bench-base");
    // The bundle crun and runc run: the very spec pinion builds for the same config.
    let bundle = work.path().join("bundle");
    let binds = rootfs::prepare_host(&bundle.join("rootfs"))?;
    let process = spec::ProcessSpec {
        args: base.args.clone(),
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        cwd: "/".into(),
        user: Default::default(),
    };

    let mut results: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let names = ["pinion", "crun", "runc"];
    for i in 0..runs {
        for k in 0..names.len() {
            // Rotate the order so no runtime always runs right after another.
            let name = names[(i + k) % names.len()];
            let id = format!("bench-{name}-{}-{i}", std::process::id());
            let (first, total) = match name {
                "pinion" => run_pinion(&rt, &config(work.path(), &id))?,
                tool => {
                    let mut cfg = base.clone();
                    cfg.id = id.clone();
                    let s = spec::build(&cfg, &process, &binds, Path::new("/pinion-bench"))?;
                    s.save(bundle.join("config.json"))?;
                    let t = peers::run_to_exit(tool, &bundle, &id)?;
                    (ms(t.first_byte), ms(t.total))
                }
            };
            let e = results.entry(name).or_default();
            e.0.push(first);
            e.1.push(total);
        }
    }
    peers::remove_parent_cgroup("pinion-bench");
    println!("{runs} runs each, interleaved; host rootfs, `echo hi`, cpus=1; milliseconds");
    println!(
        "{:<8} {:>14} {:>14} {:>14} {:>14}",
        "runtime", "first-byte p50", "first-byte p99", "total p50", "total p99"
    );
    for name in names {
        let (first, total) = &results[name];
        println!(
            "{:<8} {:>14.2} {:>14.2} {:>14.2} {:>14.2}",
            name,
            pct(first, 50.0),
            pct(first, 99.0),
            pct(total, 50.0),
            pct(total, 99.0)
        );
    }
    println!("versions: {} / {}", peers::version("crun"), peers::version("runc"));
    Ok(())
}

fn config(work: &Path, id: &str) -> ContainerConfig {
    ContainerConfig {
        mounts: Vec::new(),
        pids_limit: None,
        realtime_budget_us: None,
        id: id.into(),
        pod: "bench".into(),
        container: "main".into(),
        args: vec!["/bin/echo".into(), "hi".into()],
        env: vec![],
        cwd: "/".into(),
        rootfs: RootfsConfig::Host,
        cpus: specs::CpuSet::single(1).expect("id within MAX_ID"),
        mems: specs::NumaSet::single(0).expect("id within MAX_ID"),
        bind_memory: false,
        memory_limit_bytes: Some(128 << 20),
        cpu_quota: None,
        cpu_shares: None,
        hugepage_limits: BTreeMap::new(),
        device_nodes: vec![],
        host_network: false,
        netns: None,
        cap_add: vec![],
        cap_drop: vec![],
        system_cpus: Default::default(),
        log_path: work.join("logs").join(format!("{id}.log")),
        init: false,
        run_as: Default::default(),
        userns: None,
        output: None,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run_pinion(rt: &LibcontainerRuntime, cfg: &ContainerConfig) -> anyhow::Result<(f64, f64)> {
    let watch = LogWatch::new(&cfg.log_path)?;
    let t0 = Instant::now();
    rt.start(cfg, &mut Default::default())?;
    let started = t0.elapsed();
    let deadline = t0 + Duration::from_secs(30);
    let first = watch.wait_first_byte(deadline).with_context(|| format!("{}: no output", cfg.id))? - t0;
    while matches!(rt.state(&cfg.id)?, ContainerState::Running { .. }) {
        if Instant::now() > deadline {
            bail!("{}: did not exit", cfg.id);
        }
        std::thread::sleep(POLL);
    }
    let exited = t0.elapsed();
    rt.remove(&cfg.id)?;
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!(
            "pinion: start() {:.2} first byte {:.2} exited {:.2} removed {:.2}",
            ms(started),
            ms(first),
            ms(exited),
            ms(t0.elapsed())
        );
    }
    Ok((ms(first), ms(t0.elapsed())))
}
