//! Pinion's control plane as a library: durable store (sled), HTTPS API
//! (hyper + rustls), the topology-aware scheduler and node lifecycle.

pub mod api;
pub mod cluster;
pub mod compaction;
/// The HTTPS client lives in its own crate (no store, no CA) so that the
/// nodelet can use it without this one; re-exported for the CLI and tests.
pub use pinion_client as client;
pub mod controller;
pub mod identity;
pub mod leader;
pub mod leading;
pub mod metrics;
pub mod peers;
pub mod scheduler;
pub mod server;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
