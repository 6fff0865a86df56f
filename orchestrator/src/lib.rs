//! Pinion's control plane as a library: durable store (sled), HTTPS API
//! (hyper + rustls), the topology-aware scheduler and node lifecycle.

pub mod api;
pub mod client;
pub mod controller;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod tls;
