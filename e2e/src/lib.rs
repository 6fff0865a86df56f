//! Whole-system test helpers: locating the built `pinion` binary, a cluster
//! of killable hollow agents (`hollow`), the QEMU guest, and for the
//! benchmarks the peer runtimes (crun, runc) and latency statistics; the lanes
//! the suite runner (`ci_suite`) runs the test binaries in.

pub mod args;
pub mod binary;
pub mod chromium;
pub mod firstbyte;
pub mod hollow;
pub mod peers;
pub mod process;
pub mod qemu;
pub mod scenario;
pub mod scrape;
pub mod slurm;
pub mod stats;
pub mod suite;
pub mod up;
