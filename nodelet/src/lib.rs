//! Pinion's node agent as a library: topology discovery from sysfs, the
//! allocation checkpoint, container runtimes (`libcontainer`, `hollow`), the
//! reconcile loop and status reports. The `pinion agent` subcommand only wires it.

pub mod affinity;
pub mod agent;
pub mod checkpoint;
pub mod discovery;
pub mod fsutil;
pub mod manifests;
pub mod runtime;
pub mod source;
