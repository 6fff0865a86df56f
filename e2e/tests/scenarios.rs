//! Every scenario under `e2e/scenarios/`, each on a fresh cluster of real
//! `pinion` processes (see `e2e::scenario`). A failing scenario lists each
//! expectation that failed with what it saw, and names the folder with the
//! processes' output and the CLI transcript.

use std::path::PathBuf;
use std::sync::Mutex;

/// Real-container scenarios share this host's CPU 1: one at a time.
static HOST: Mutex<()> = Mutex::new(());

/// The real machines' sysfs trees kept in the repository.
fn fixtures() -> PathBuf {
    e2e::binary::repo_root().join("e2e/fixtures/sysfs")
}

fn scenario(name: &str) {
    scenario_on(name, None);
}

/// A scenario with its server's store chosen here (`None`: the file's own).
fn scenario_on(name: &str, store: Option<e2e::scenario::StoreKind>) {
    let path = e2e::binary::repo_root().join("e2e/scenarios").join(format!("{name}.yaml"));
    let real = name.ends_with("-real");
    let _host = real.then(|| HOST.lock().unwrap_or_else(|e| e.into_inner()));
    let pinion = e2e::binary::pinion().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = match store {
        Some(s) => format!("{name}-{s:?}").to_lowercase(),
        None => name.to_string(),
    };
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("scenarios").join(dir);
    let outcome =
        e2e::scenario::run_on(&path, &pinion, &fixtures(), &out, store).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    if let Some(why) = &outcome.skipped {
        eprintln!("skipping scenario {name}: {why}");
        return;
    }
    println!("scenario {name}: {}", outcome.attempts_summary());
    assert!(
        outcome.failures.is_empty(),
        "scenario {name} failed (output kept in {}):\n  {}",
        outcome.out_dir.display(),
        outcome.failures.join("\n  ")
    );
}

macro_rules! scenarios {
    ($($test:ident => $file:literal),* $(,)?) => {
        $(#[test] fn $test() { scenario($file) })*

        #[test]
        fn every_file_has_a_test() {
            let listed = [$($file),*];
            let dir = e2e::binary::repo_root().join("e2e/scenarios");
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().trim_end_matches(".yaml").to_string();
                assert!(listed.contains(&name.as_str()), "{name}.yaml has no test in e2e/tests/scenarios.rs");
            }
        }
    };
}

scenarios! {
    s0_seed_mixed_real => "0-seed-mixed-real",
    s1_alignment => "1-alignment",
    s2_knowledge_gap => "2-knowledge-gap",
    s2_knowledge_gap_blind => "2-knowledge-gap-blind",
    s3_cpu_manager => "3-cpu-manager",
    s3_cpu_manager_real => "3-cpu-manager-real",
    s4_whole_sockets => "4-whole-sockets",
    s5_crane_policies => "5-crane-policies",
    s6_scopes => "6-scopes",
    s7_memory_hugepages => "7-memory-hugepages",
    s8_restarts => "8-restarts",
    s8_restarts_real => "8-restarts-real",
    s9_allocatable => "9-allocatable",
    s10_job_queue => "10-job-queue",
    s11_nodelet_kills => "11-nodelet-kills",
    s11_nodelet_kills_real => "11-nodelet-kills-real",
    s12_settings_change_real => "12-settings-change-real",
    s13_gangs => "13-gangs",
    s14_gang_real => "14-gang-real",
    s15_mpi_real => "15-mpi-real",
}

/// The restarts scenario (kill -9 of the server and of a node, a node cut
/// off) with the server's state in etcd: what was acknowledged survives the
/// server's kill there as it does in sled.
#[test]
fn s8_restarts_on_etcd() {
    scenario_on("8-restarts", Some(e2e::scenario::StoreKind::Etcd));
}
