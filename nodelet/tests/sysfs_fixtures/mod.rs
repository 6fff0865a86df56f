//! The real machines' sysfs trees kept in the repository
//! (`e2e/fixtures/sysfs/*.tar.gz`), shared by the nodelet's tests and, by
//! `#[path]`, the CLI's.
#![allow(dead_code)] // each test crate uses a part

use std::path::{Path, PathBuf};

pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/fixtures/sysfs")
}

/// Every fixture tarball, sorted by name.
pub fn tarballs() -> Vec<PathBuf> {
    let dir = dir();
    let mut tarballs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(".tar.gz")))
        .collect();
    tarballs.sort();
    tarballs
}

pub fn unpack(tarball: &Path, into: &Path) {
    let file = std::fs::File::open(tarball).unwrap_or_else(|e| panic!("{}: {e}", tarball.display()));
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    // The dumps hold many dangling (relative, in-root) symlinks; tar creates them as is.
    archive.unpack(into).unwrap_or_else(|e| panic!("unpacking {}: {e}", tarball.display()));
}

/// One fixture, by name, unpacked into a fresh temporary folder (the root).
pub fn extract(name: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    unpack(&dir().join(format!("{name}.tar.gz")), tmp.path());
    tmp
}
