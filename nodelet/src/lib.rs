//! Pinion's node agent as a library: topology discovery from sysfs, the
//! allocation checkpoint, container runtimes (`libcontainer`, `hollow`), the
//! reconcile loop and status reports, and the daemon around them (`daemon::run`:
//! the agent, its static-pod folder, the link to an orchestrator and the
//! node's HTTPS endpoint). `pinion agent` and `pinion up` only parse flags.

pub(crate) mod affinity;
pub mod agent;
pub mod checkpoint;
pub mod cni;
pub mod daemon;
pub(crate) mod datadir;
pub mod devices;
pub mod discovery;
pub mod down;
pub mod endpoint;
pub mod fault;
pub mod fsutil;
pub(crate) mod host;
pub mod hwloc;
pub(crate) mod link;
pub mod manifests;
pub mod metrics;
pub mod netcheck;
pub mod peers;
pub mod registry;
pub mod routes;
pub mod runtime;
pub mod source;
pub mod tuning;
