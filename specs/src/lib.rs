//! Pinion's API objects, their validation, the topology model and the one
//! admission engine. No I/O: no tokio, no filesystem, no network, no clocks.

#![forbid(unsafe_code)]

pub mod acct;
pub mod api;
pub mod backfill;
pub mod batch;
pub mod daemonset;
pub mod dependency;
pub mod deployment;
pub mod engine;
pub mod fairshare;
pub mod idset;
pub mod job;
pub mod limits;
pub mod manifest;
pub mod net;
pub mod node_lost;
pub mod partition;
pub mod pod;
pub mod probe;
pub mod qos;
pub mod quantity;
pub mod queue;
pub mod rollout;
pub mod security;
pub mod status;
pub mod step;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod topology;
pub mod validate;

pub use engine::{
    admit, Allocations, ContainerPlacement, CpuManagerOptions, NodeSettings, Placement, RejectReason, Rejection,
};
pub use idset::{CpuSet, IdSet, NumaSet};
pub use pod::{Container, CpuPolicy, Pod, PodSpec, RestartPolicy, TopologyPolicy, TopologyScope};
pub use quantity::Quantity;
pub use status::{PodPhase, PodStatus};
pub use topology::{NodeTopology, NumaKind};
