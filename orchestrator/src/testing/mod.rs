//! Test fixtures this crate's tests and other crates' reuse (feature
//! `testing`): real etcd clusters, a real server in-process.

pub mod etcd;
pub mod server;
