//! Inputs the `sysfs` fuzz target (`fuzz/fuzz_targets/sysfs.rs`) found, kept in
//! `tests/fuzz-regressions/sysfs/`, each checked as the target checks it: the
//! tree they describe (`sysfs_input`'s format) is discovered without a panic,
//! and what discovery accepts passes `validate_topology`, the engine's
//! precondition.

mod sysfs_input;

use std::path::Path;

#[test]
fn sysfs_inputs_the_fuzzer_found() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-regressions/sysfs");
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("read the regression folder").path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no inputs in {}", dir.display());
    let files = sysfs_input::files();
    for input in inputs {
        let data = std::fs::read(&input).expect("read a regression input");
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        sysfs_input::write_tree(&root, &files, &data).expect("write the tree");
        if let Ok(topology) = nodelet::discovery::discover(&root) {
            let problems = specs::validate::validate_topology(&topology);
            assert!(problems.is_empty(), "{}: discovery accepted an invalid topology: {problems:?}", input.display());
        }
    }
}
