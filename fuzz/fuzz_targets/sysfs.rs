//! `nodelet::discovery::discover` over a small machine's sysfs tree (4 CPUs, 2
//! NUMA nodes, 1 PCI device) whose file contents come from the fuzz input; the
//! format is `nodelet/tests/sysfs_input`'s, shared with the regression tests.
//! Discovery reads through `std::fs`, so the tree is real files, in one folder
//! per process on /dev/shm when it exists.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

#[path = "../../nodelet/tests/sysfs_input/mod.rs"]
mod sysfs_input;

fn files() -> &'static [String] {
    static FILES: OnceLock<Vec<String>> = OnceLock::new();
    FILES.get_or_init(sysfs_input::files)
}

fn root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        base.join(format!("pinion-fuzz-sysfs-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let root = root();
    let _ = std::fs::remove_dir_all(root);
    sysfs_input::write_tree(root, files(), data).expect("write the fuzz tree");
    if let Ok(topology) = nodelet::discovery::discover(root) {
        // The engine's precondition: a discovered topology is one it may be given.
        let problems = specs::validate::validate_topology(&topology);
        assert!(problems.is_empty(), "discovery produced an invalid topology: {problems:?}\n{topology:#?}");
    }
});
