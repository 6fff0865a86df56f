//! Pinion's control plane as a library: durable store (sled), HTTPS API
//! (hyper + rustls), the topology-aware scheduler and node lifecycle.

pub mod scheduler;
pub mod store;
pub mod tls;
