//! Pull benchmark: an image of about `--mb` MB (incompressible files, in
//! `--layers` layers) in a registry on loopback (Debian's `docker-registry`,
//! plain HTTP), pulled and unpacked into a fresh image store by `pinion image
//! pull` against `skopeo copy` into an OCI layout followed by `umoci unpack`
//! of it (the Debian tools a site would reach for), interleaved, `--runs`
//! times each: wall time from the spawn to the exit of the command(s).
//!
//! Usage (as root): `bench_pull [--runs N] [--mb N] [--layers N] [--pinion
//! PATH]` (defaults 5, 100, 4, `target/release/pinion`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::stats::{load_average, Summary};

struct Opts {
    runs: usize,
    mb: usize,
    layers: usize,
    pinion: PathBuf,
}

fn opts() -> anyhow::Result<Opts> {
    let mut o = Opts { runs: 5, mb: 100, layers: 4, pinion: PathBuf::from("target/release/pinion") };
    let mut args = e2e::args::Args::from_env();
    while let Some(a) = args.flag() {
        match a.as_str() {
            "--runs" => o.runs = args.num("--runs")?,
            "--mb" => o.mb = args.num("--mb")?,
            "--layers" => o.layers = args.num("--layers")?.max(1),
            "--pinion" => o.pinion = args.path("--pinion")?,
            other => bail!("unknown argument {other}"),
        }
    }
    o.pinion = std::fs::canonicalize(&o.pinion).with_context(|| o.pinion.display().to_string())?;
    Ok(o)
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdout(Stdio::null()).output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

/// A layout `dir:big` whose layers hold `mb` MB of random bytes in 5 MB files.
fn make_image(dir: &Path, mb: usize, layers: usize) -> anyhow::Result<()> {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout))?;
    run(Command::new("umoci").args(["new", "--image"]).arg(format!("{}:big", layout.display())))?;
    let files = mb.div_ceil(5);
    for l in 0..layers {
        run(Command::new("umoci").args(["unpack", "--image"]).arg(format!("{}:big", layout.display())).arg(&bundle))?;
        let data = bundle.join("rootfs").join(format!("layer{l}"));
        std::fs::create_dir_all(&data)?;
        for f in (0..files).filter(|f| f % layers == l) {
            let mut random = std::io::Read::take(std::fs::File::open("/dev/urandom")?, 5 << 20);
            std::io::copy(&mut random, &mut std::fs::File::create(data.join(format!("f{f}")))?)?;
        }
        run(Command::new("umoci").args(["repack", "--image"]).arg(format!("{}:big", layout.display())).arg(&bundle))?;
        std::fs::remove_dir_all(&bundle)?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let o = opts()?;
    let tmp = tempfile::Builder::new().prefix("bench-pull-").tempdir()?;
    let dir = tmp.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let host = format!("127.0.0.1:{port}");
    let config = dir.join("registry.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
            dir.join("registry").display()
        ),
    )?;
    let mut registry = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("docker-registry (e2e/host-setup.sh installs it)")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&host).is_err() {
        if Instant::now() > deadline {
            bail!("the registry did not listen on {host}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = (|| -> anyhow::Result<()> {
        make_image(dir, o.mb, o.layers)?;
        let image = format!("{host}/big:1");
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:big", dir.join("layout").display()))
            .arg(format!("docker://{image}")))?;
        let (mut ours, mut peer) = (Vec::new(), Vec::new());
        for i in 0..o.runs {
            let data = dir.join(format!("data-{i}"));
            ours.push(timed(|| {
                run(Command::new(&o.pinion)
                    .args(["image", "pull", &image, "--insecure-registry", &host, "--data-dir"])
                    .arg(&data))
            })?);
            let (layout, bundle) = (dir.join(format!("peer-{i}")), dir.join(format!("peer-bundle-{i}")));
            peer.push(timed(|| {
                run(Command::new("skopeo")
                    .args(["copy", "--quiet", "--src-tls-verify=false"])
                    .arg(format!("docker://{image}"))
                    .arg(format!("oci:{}:big", layout.display())))?;
                run(Command::new("umoci")
                    .args(["unpack", "--image"])
                    .arg(format!("{}:big", layout.display()))
                    .arg(&bundle))
            })?);
            for d in [data, layout, bundle] {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        let (a, b) = (Summary::of(&ours), Summary::of(&peer));
        println!("image: {} MB in {} layers, {} runs each, load {:.2}", o.mb, o.layers, o.runs, load_average());
        println!("pinion image pull:            median {:>8.1} ms  min {:>8.1} ms", a.median, a.min);
        println!("skopeo copy + umoci unpack:   median {:>8.1} ms  min {:>8.1} ms", b.median, b.min);
        println!("ratio (pinion / peer):        {:.2}x", a.median / b.median);
        Ok(())
    })();
    let _ = registry.kill();
    let _ = registry.wait();
    result
}
