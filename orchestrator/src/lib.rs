//! Pinion's control plane as a library: durable store (sled), HTTPS API
//! (hyper + rustls), the cluster's rules (`cluster`), the topology-aware
//! scheduler and the controller. What travels the wire, and the HTTPS client
//! the CLI and the nodelet share, is the `pinion_wire` crate.

pub mod api;
pub(crate) mod cluster;
pub(crate) mod compaction;
pub(crate) mod controller;
pub mod etcdv3;
pub(crate) mod identity;
pub(crate) mod leader;
pub(crate) mod leading;
pub(crate) mod metrics;
pub(crate) mod peers;
pub mod scheduler;
pub mod server;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
