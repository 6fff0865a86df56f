//! Whole-system test helpers: locating the built `pinion` binary, temp clusters.

pub mod binary;
pub mod host;
pub mod qemu;
pub mod relay;
pub mod scenario;
