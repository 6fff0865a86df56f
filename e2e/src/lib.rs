//! Whole-system test helpers: locating the built `pinion` binary, temp clusters.
