//! Container start benchmark: pinion's libcontainer runtime (shim per
//! container) against `crun run` and `runc run` of the same OCI bundle,
//! interleaved, in one private mount namespace (crun 1.8 refuses this host's
//! hybrid cgroups unless `unified/cgroup.controllers` is hidden; every runtime
//! runs in that namespace so none pays for the trick alone).
//!
//! Usage (as root): `bench_start [--runs N] [--pinion PATH]`; installs Debian
//! `crun` and `runc` with apt-get when they are missing. Prints, per runtime,
//! median and p99 of: create -> first stdout byte, and create+start+exit+delete.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nodelet::runtime::libcontainer::{rootfs, spec, LibcontainerRuntime};
use nodelet::runtime::{ContainerConfig, ContainerState, RootfsConfig, Runtime};

const POLL: Duration = Duration::from_micros(200);

fn main() -> anyhow::Result<()> {
    let mut runs = 50usize;
    let mut pinion = PathBuf::from("target/release/pinion");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().context("--runs N")?.parse()?,
            "--pinion" => pinion = PathBuf::from(args.next().context("--pinion PATH")?),
            other => bail!("unknown argument {other}"),
        }
    }
    let pinion = std::fs::canonicalize(&pinion).with_context(|| format!("{}", pinion.display()))?;
    ensure_tools()?;
    private_mount_namespace()?;

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
                    let mut s = spec::build(&cfg, &process, &binds)?;
                    if let Some(l) = s.linux_mut().as_mut() {
                        l.set_cgroups_path(Some(PathBuf::from(format!("/pinion-bench/{id}"))));
                    }
                    s.save(bundle.join("config.json"))?;
                    run_oci(tool, &bundle, &id)?
                }
            };
            let e = results.entry(name).or_default();
            e.0.push(first);
            e.1.push(total);
        }
    }
    // The (empty) parent cgroup crun and runc ran under, in every hierarchy.
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join("pinion-bench"));
    }
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
    println!("versions: {} / {}", version("crun"), version("runc"));
    Ok(())
}

fn config(work: &Path, id: &str) -> ContainerConfig {
    ContainerConfig {
        id: id.into(),
        pod: "bench".into(),
        container: "main".into(),
        args: vec!["/bin/echo".into(), "hi".into()],
        env: vec![],
        cwd: "/".into(),
        rootfs: RootfsConfig::Host,
        cpus: specs::CpuSet::single(1),
        mems: specs::NumaSet::single(0),
        bind_memory: false,
        memory_limit_bytes: Some(128 << 20),
        cpu_quota: None,
        cpu_shares: None,
        hugepage_limits: BTreeMap::new(),
        device_nodes: vec![],
        host_network: false,
        log_path: work.join("logs").join(format!("{id}.log")),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run_pinion(rt: &LibcontainerRuntime, cfg: &ContainerConfig) -> anyhow::Result<(f64, f64)> {
    let t0 = Instant::now();
    rt.start(cfg)?;
    let started = t0.elapsed();
    let deadline = t0 + Duration::from_secs(30);
    while std::fs::metadata(&cfg.log_path).map(|m| m.len()).unwrap_or(0) == 0 {
        if Instant::now() > deadline {
            bail!("{}: no output", cfg.id);
        }
        std::thread::sleep(POLL);
    }
    let first = t0.elapsed();
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

fn run_oci(tool: &str, bundle: &Path, id: &str) -> anyhow::Result<(f64, f64)> {
    let t0 = Instant::now();
    let mut child = Command::new(tool)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {tool}"))?;
    let mut out = child.stdout.take().context("stdout")?;
    let mut byte = [0u8; 1];
    let n = out.read(&mut byte)?;
    let first = t0.elapsed();
    let mut rest = Vec::new();
    out.read_to_end(&mut rest)?;
    let status = child.wait()?;
    let total = t0.elapsed();
    if n == 0 || !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        bail!("{tool} run {id}: {status}, no output: {err}");
    }
    Ok((ms(first), ms(total)))
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    let idx = ((p / 100.0) * (s.len() - 1) as f64).round() as usize;
    s[idx.min(s.len() - 1)]
}

fn version(tool: &str) -> String {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string())
        .unwrap_or_default()
}

fn ensure_tools() -> anyhow::Result<()> {
    let missing = ["crun", "runc"].iter().any(|t| Command::new(t).arg("--version").output().is_err());
    if missing {
        eprintln!("installing crun and runc (apt-get)");
        let ok = Command::new("apt-get").args(["update", "-qq"]).status()?.success()
            && Command::new("apt-get")
                .args(["install", "-y", "-qq", "crun", "runc"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()?
                .success();
        if !ok {
            bail!("apt-get install crun runc failed");
        }
    }
    Ok(())
}

/// A private mount namespace for this process and its children, with the
/// cgroup2 controllers file hidden so crun treats the host as cgroup v1.
fn private_mount_namespace() -> anyhow::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making / private")?;
    let controllers = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    if controllers.exists() {
        let empty = std::env::temp_dir().join(format!("pinion-bench-empty-{}", std::process::id()));
        std::fs::write(&empty, b"")?;
        mount(Some(&empty), controllers, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .context("hiding cgroup.controllers")?;
        let _ = std::fs::remove_file(&empty);
    }
    Ok(())
}
