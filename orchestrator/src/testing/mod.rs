//! Test fixtures other crates' tests reuse (feature `testing`).

pub mod etcd;
