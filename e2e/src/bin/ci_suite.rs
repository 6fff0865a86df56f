//! The whole test suite, as `.ci/run` runs it: what `cargo test --workspace
//! --no-fail-fast` runs, with the test binaries that mostly wait run beside the
//! rest (`e2e::suite` says which and why).
//!
//! `cargo test` itself cannot do that: it runs its binaries one after another,
//! and a second `cargo test` waits for the first one's lock on the build folder.
//! So this builds them with `cargo test --no-run`, runs each built binary as
//! cargo would (from its package's folder, with `CARGO` and
//! `CARGO_MANIFEST_DIR` set), prints each one's output whole when it ends, then
//! runs the doc tests. `PINION_SUITE_SERIAL=1` runs everything one at a time.
//! `.ci/run` builds this binary with the tests and runs it from the target
//! folder: `cargo run -p e2e` would build its dependencies again with e2e's
//! features alone.
//!
//! The e2e tests run the `pinion` this build made (`PINION_BIN`). Left to
//! themselves they run `cargo build -p cli`, whose features differ from the
//! workspace's: a second build of nodelet and cli, 40 s alone and minutes
//! when two lanes wait on cargo's lock for it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use e2e::suite::{lanes, TestBinary};

/// A test binary still running after this is killed. The longest, the QEMU
/// test's two guests one after the other, bounds each boot at 10 minutes and
/// boots a guest once more when the emulated machine failed it; this bound
/// then ends the worst case.
const BINARY_TIMEOUT: Duration = Duration::from_secs(20 * 60);

struct Built {
    binary: TestBinary,
    executable: PathBuf,
    source: PathBuf,
    package_dir: PathBuf,
}

struct Outcome {
    binary: TestBinary,
    ok: bool,
    wall: Duration,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(101),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(101)
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = e2e::binary::repo_root();
    let started = Instant::now();
    let (built, pinion) = build(&cargo, &root)?;
    println!("built {} test binaries in {:.0} s", built.len(), started.elapsed().as_secs_f64());

    let serial = std::env::var_os("PINION_SUITE_SERIAL").is_some_and(|v| v != "0" && !v.is_empty());
    let by_name: BTreeMap<String, &Built> = built.iter().map(|b| (b.binary.cargo_args(), b)).collect();
    let plan = lanes(&built.iter().map(|b| b.binary.clone()).collect::<Vec<_>>(), !serial);

    let (done, results) = mpsc::channel::<(Outcome, String)>();
    let tests_started = Instant::now();
    let mut outcomes = Vec::new();
    std::thread::scope(|scope| {
        for lane in &plan {
            let done = done.clone();
            let by_name = &by_name;
            let cargo = &cargo;
            let root = &root;
            let pinion = pinion.as_deref();
            scope.spawn(move || {
                for binary in lane {
                    let Some(b) = by_name.get(&binary.cargo_args()) else { continue };
                    if done.send(run_binary(b, cargo, root, pinion)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done);
        // Each binary's output whole, as it ends: the lanes' never interleave.
        for (outcome, output) in results {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(output.as_bytes());
            let _ = out.flush();
            outcomes.push(outcome);
        }
    });
    let tests_wall = tests_started.elapsed();

    println!("   Doc-tests (cargo test --workspace --doc)");
    let doc = Command::new(&cargo)
        .current_dir(&root)
        .args(["test", "--workspace", "--doc", "--no-fail-fast"])
        .status()
        .context("running cargo test --doc")?;

    outcomes.sort_by_key(|o| std::cmp::Reverse(o.wall));
    println!(
        "\n{} test binaries in {:.0} s ({} at a time at most); the longest:",
        outcomes.len(),
        tests_wall.as_secs_f64(),
        plan.len()
    );
    for o in outcomes.iter().take(8) {
        println!("  {:>6.1} s  {}", o.wall.as_secs_f64(), o.binary.cargo_args());
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.ok).collect();
    if !doc.success() {
        println!("error: the doc tests failed ({doc})");
    }
    if !failed.is_empty() {
        println!("error: {} target{} failed:", failed.len(), if failed.len() == 1 { "" } else { "s" });
        for o in &failed {
            println!("    `{}`", o.binary.cargo_args());
        }
    }
    println!("the suite took {:.0} s", started.elapsed().as_secs_f64());
    Ok(failed.is_empty() && doc.success())
}

/// `cargo test --workspace --no-run`: the test binaries, in the order cargo
/// would run them (package, then library, binaries, integration tests), and
/// the `pinion` binary it built.
fn build(cargo: &std::ffi::OsStr, root: &Path) -> anyhow::Result<(Vec<Built>, Option<PathBuf>)> {
    let packages = package_names(cargo, root)?;
    let mut child = Command::new(cargo)
        .current_dir(root)
        .args(["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test --no-run")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut built = Vec::new();
    let mut pinion = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        let Ok(m) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if m["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = m["executable"].as_str() else { continue };
        if m["profile"]["test"] != true {
            if m["target"]["name"] == "pinion" && m["target"]["kind"][0] == "bin" {
                pinion = Some(PathBuf::from(executable));
            }
            continue;
        }
        let manifest = m["manifest_path"].as_str().context("a compiler artifact without manifest_path")?;
        let package = packages.get(manifest).with_context(|| format!("{manifest}: not a workspace package"))?;
        let kind = m["target"]["kind"][0].as_str().unwrap_or("lib");
        let kind = if kind == "lib" || kind == "rlib" || kind == "proc-macro" { "lib" } else { kind };
        built.push(Built {
            binary: TestBinary {
                package: package.clone(),
                kind: kind.to_string(),
                name: m["target"]["name"].as_str().unwrap_or_default().to_string(),
            },
            executable: executable.into(),
            source: m["target"]["src_path"].as_str().unwrap_or_default().into(),
            package_dir: Path::new(manifest).parent().unwrap_or(root).to_path_buf(),
        });
    }
    let status = child.wait().context("waiting for cargo test --no-run")?;
    if !status.success() {
        bail!("cargo test --workspace --no-run failed ({status})");
    }
    let rank = |kind: &str| match kind {
        "lib" => 0,
        "bin" => 1,
        _ => 2,
    };
    built.sort_by(|a, b| {
        (&a.binary.package, rank(&a.binary.kind), &a.binary.name).cmp(&(
            &b.binary.package,
            rank(&b.binary.kind),
            &b.binary.name,
        ))
    });
    Ok((built, pinion))
}

/// Manifest path to package name, for the workspace's own packages.
fn package_names(cargo: &std::ffi::OsStr, root: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).context("cargo metadata's JSON")?;
    Ok(meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["manifest_path"].as_str()?.to_string(), p["name"].as_str()?.to_string())))
        .collect())
}

/// Runs one test binary to its end (or `BINARY_TIMEOUT`), its output in a file
/// rather than a pipe so that nothing it leaves running can hold the run open.
fn run_binary(b: &Built, cargo: &std::ffi::OsStr, root: &Path, pinion: Option<&Path>) -> (Outcome, String) {
    let relative =
        |p: &Path| p.strip_prefix(&b.package_dir).or_else(|_| p.strip_prefix(root)).unwrap_or(p).display().to_string();
    let header = format!(
        "     Running {} ({})\n",
        if b.binary.kind == "lib" { format!("unittests {}", relative(&b.source)) } else { relative(&b.source) },
        relative(&b.executable)
    );
    let started = Instant::now();
    let result = (|| -> anyhow::Result<(bool, String)> {
        let mut log = tempfile::tempfile().context("a file for the binary's output")?;
        let mut command = Command::new(&b.executable);
        if let Some(pinion) = pinion {
            command.env("PINION_BIN", pinion);
        }
        let mut child = command
            .current_dir(&b.package_dir)
            .env("CARGO", cargo)
            .env("CARGO_MANIFEST_DIR", &b.package_dir)
            .env("CARGO_PKG_NAME", &b.binary.package)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the output file")?)
            .stderr(log.try_clone().context("duplicating the output file")?)
            // In this process's group, as under `cargo test`: a Ctrl-C at the
            // terminal reaches every binary and what it started.
            .spawn()
            .with_context(|| format!("starting {}", b.executable.display()))?;
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for the binary")? {
                break Some(status);
            }
            if started.elapsed() > BINARY_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        log.rewind().context("rewinding the output file")?;
        let mut bytes = Vec::new();
        log.read_to_end(&mut bytes).context("reading the binary's output")?;
        let mut output = String::from_utf8_lossy(&bytes).into_owned();
        match status {
            Some(s) if s.success() => Ok((true, output)),
            Some(s) => {
                output.push_str(&format!("error: test failed ({s}), to rerun pass `{}`\n", b.binary.cargo_args()));
                Ok((false, output))
            }
            None => {
                output.push_str(&format!(
                    "error: killed after {BINARY_TIMEOUT:?}, to rerun pass `{}`\n",
                    b.binary.cargo_args()
                ));
                Ok((false, output))
            }
        }
    })();
    let (ok, body) = result.unwrap_or_else(|e| (false, format!("error: {e:#}\n")));
    (Outcome { binary: b.binary.clone(), ok, wall: started.elapsed() }, format!("{header}\n{body}"))
}
