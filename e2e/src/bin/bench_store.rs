//! The sled store under churn: `--pods` pods with a `--kib` KiB annotation
//! each are deleted and created again, `--rounds` times, through
//! `orchestrator::store::Store` (every write acknowledged after its flush, as
//! the server's are). After every `--every` rounds it prints the live bytes
//! (the pods' JSON as listed), the store dir's size on disk (allocated
//! blocks, as `du` counts them), and the RSS of a fresh process that opens the
//! store again and lists the pods (a server's restart).
//!
//! Usage: `bench_store [--pods N] [--kib K] [--rounds R] [--every E] [--tasks T] [--dir PATH]`
//! (defaults 400, 200, 20, 5, 16, a temporary dir). `bench_store --reopen DIR`
//! is the child that measures a reopen.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};
use orchestrator::store::{Store, StoreError, StoreOptions};
use specs::Pod;

fn main() -> anyhow::Result<()> {
    let (mut pods, mut kib, mut rounds, mut every, mut tasks) = (400usize, 200usize, 20usize, 5usize, 16usize);
    let mut dir: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--pods" => pods = value()?.parse()?,
            "--kib" => kib = value()?.parse()?,
            "--rounds" => rounds = value()?.parse()?,
            "--every" => every = value()?.parse::<usize>()?.max(1),
            "--tasks" => tasks = value()?.parse::<usize>()?.max(1),
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--reopen" => return reopen(Path::new(&value()?)),
            other => bail!("unknown argument {other}"),
        }
    }
    let temp = tempfile::tempdir()?;
    let dir = dir.unwrap_or_else(|| temp.path().join("store"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    println!("{pods} pods of {kib} KiB, {rounds} rounds of delete + create, store at {}", dir.display());
    println!("| rounds | writes | live MiB | store on disk MiB | ratio | RSS after reopen MiB (peak) | reopen s |");
    println!("|---|---|---|---|---|---|---|");
    let mut writes = 0usize;
    let mut done = 0usize;
    while done < rounds {
        let batch = every.min(rounds - done);
        runtime.block_on(async {
            let store = Store::open(&dir, StoreOptions::default())?;
            for round in done..done + batch {
                writes += churn(&store, pods, kib, tasks, round).await?;
            }
            if !store.close(std::time::Duration::from_secs(60)).await {
                bail!("the store did not close within 60 s");
            }
            Ok(())
        })?;
        done += batch;
        let on_disk = disk_bytes(&dir)?;
        let me = std::env::current_exe()?;
        let started = Instant::now();
        let out = Command::new(me).arg("--reopen").arg(&dir).output()?;
        let secs = started.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!("reopen failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        // The child prints `LIVE_BYTES RSS_KIB HWM_KIB`.
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<u64> = text.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        let [live, rss, hwm] = fields[..] else { bail!("unexpected reopen output {text:?}") };
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "| {done} | {writes} | {:.1} | {:.1} | {:.1}x | {:.0} ({:.0}) | {secs:.1} |",
            mib(live),
            mib(on_disk),
            on_disk as f64 / live.max(1) as f64,
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
    }
    Ok(())
}

/// One round: every pod deleted (when it exists) and created again with a
/// fresh body, from `tasks` writers. Returns the writes made.
async fn churn(store: &Store, pods: usize, kib: usize, tasks: usize, round: usize) -> anyhow::Result<usize> {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut writes = 0usize;
            for i in (t..pods).step_by(tasks) {
                let name = format!("churn-{i}");
                let gone = name.clone();
                store.write(move |txn| txn.delete::<Pod>(&gone).map(|_| ())).await?;
                let p = pod(&name, kib, (round * pods + i) as u64)?;
                store.write(move |txn| -> Result<u64, StoreError> { txn.put(&mut p.clone()) }).await?;
                writes += 2;
            }
            Ok::<usize, anyhow::Error>(writes)
        }));
    }
    let mut writes = 0;
    for h in handles {
        writes += h.await??;
    }
    Ok(writes)
}

/// A pod whose annotation holds `kib` KiB of pseudo-random hex (not
/// compressible, as real payloads mostly are not).
fn pod(name: &str, kib: usize, seed: u64) -> anyhow::Result<Pod> {
    let text = format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: busybox}}]\n"
    );
    let mut p = Pod::from_yaml(&text).map_err(|e| anyhow::anyhow!("bench manifest: {e}"))?;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut blob = String::with_capacity(kib * 1024);
    while blob.len() < kib * 1024 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        blob.push_str(&format!("{x:016x}"));
    }
    blob.truncate(kib * 1024);
    p.metadata.annotations.insert("bench.pinion.io/blob".into(), blob);
    Ok(p)
}

/// The child: opens the store as a restarted server does, lists the pods,
/// prints their bytes and its own RSS and peak.
fn reopen(dir: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let live = runtime.block_on(async {
        let store = Store::open(dir, StoreOptions::default())?;
        let listed = store.list::<Pod>()?;
        let mut live = 0u64;
        for p in &listed.items {
            live += serde_json::to_vec(p)?.len() as u64;
        }
        Ok::<u64, anyhow::Error>(live)
    })?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    println!("{live} {} {}", field("VmRSS:"), field("VmHWM:"));
    Ok(())
}

/// Bytes allocated under `dir` (`du`'s figure, sparse files counted as stored).
fn disk_bytes(dir: &Path) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { disk_bytes(&entry.path())? } else { meta.blocks() * 512 };
    }
    Ok(total)
}
