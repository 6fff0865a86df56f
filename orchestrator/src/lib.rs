//! Pinion's control plane as a library: durable store (sled), HTTPS API
//! (hyper + rustls), the topology-aware scheduler and node lifecycle.

pub mod api;
pub(crate) mod cluster;
pub(crate) mod compaction;
/// The HTTPS client lives in its own crate (no store, no CA) so that the
/// nodelet can use it without this one; re-exported for the CLI and tests.
pub use pinion_client as client;
pub(crate) mod controller;
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
