//! The real machines' sysfs trees kept in the repository
//! (`e2e/fixtures/sysfs/*.tar.gz`), shared by the tests that read them all.

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
