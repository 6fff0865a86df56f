//! Inputs that broke a fuzz target (`fuzz/fuzz_targets/`), kept in
//! `tests/fuzz-regressions/<target>/` and checked here as the target checks
//! them, on stable, in the normal test suite.

use std::path::{Path, PathBuf};

use specs::validate::validate_topology;
use specs::NodeTopology;

mod topology_input;

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions").join(target);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("read the regression folder").path())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no inputs in {}", dir.display());
    v
}

/// `topology_json`: every kept input runs through the target's own body
/// (no panic), and deserializes, as it did when it was found.
#[test]
fn topology_json_inputs() {
    for input in inputs("topology_json") {
        let data = std::fs::read(&input).expect("read a regression input");
        assert!(topology_input::check(&data).is_some(), "{}: no longer deserializes", input.display());
    }
}

/// A CPU id beyond `MAX_ID` is reported on its own field, and nothing else is
/// built from it (a set holding 4294967295 is 512 MiB, and printing it overflowed).
#[test]
fn a_huge_cpu_id_is_one_problem() {
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions/topology_json/cpu-id-u32-max.json");
    let topology: NodeTopology =
        serde_json::from_slice(&std::fs::read(input).expect("read the input")).expect("deserializes");
    let fields: Vec<String> = validate_topology(&topology).into_iter().map(|e| e.field).collect();
    assert_eq!(fields, ["cpus[0].id"]);
}
