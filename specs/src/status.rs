//! Statuses: what the nodelet observed and the orchestrator reports.
//!
//! Phase transitions are checked with `can_*` methods so that a late report can
//! never move a pod backwards.

use serde::{Deserialize, Serialize};

use crate::idset::{CpuSet, NumaSet};
use crate::pod::CpuPolicy;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PodPhase {
    /// Accepted, not yet placed (or placed and rejected, waiting to retry).
    #[default]
    Pending,
    /// Bound to a node by the scheduler; the nodelet has not started it yet.
    Scheduled,
    Running,
    Succeeded,
    Failed,
    /// Its node stopped reporting; the pod is probably still running there.
    Unknown,
}

impl PodPhase {
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// A terminal phase is final; everything else may move anywhere.
    pub fn can_become(self, next: PodPhase) -> bool {
        !self.is_terminal() || self == next
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    pub phase: PodPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Why the pod is where it is (or why it is pending), one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339: a stopping pod's end of grace, when its node kills what
    /// is left (`reason` is `Terminating`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ends: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementSummary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_statuses: Vec<ContainerStatus>,
    /// How many times a node was tried for this pod (scheduler binds + nodelet rejections).
    #[serde(default)]
    pub attempts: u32,
    /// The scheduler's full plan and the node allocation epoch it was computed
    /// against; the nodelet adopts it when the epoch still matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::api::PodPlan>,
    /// In a node's report: the uid of the pod this status is about. A pod
    /// deleted and created again under the same name is another pod; the
    /// server applies a reported status only to the pod with this uid (a
    /// report still about the old one must not end or start the new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The pod's address on its node's pod network (CNI), the first of
    /// `pod_ips`; absent for a `hostNetwork` pod, a node without a CNI
    /// network and the hollow runtime.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// Every address the pod network gave the pod (IPv4 and IPv6).
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    /// `Ready` (every container running and passing its readiness probe, as
    /// its node judges), as Kubernetes has it; absent until a node says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PodCondition>,
    /// RFC 3339: when the server first heard the pod run (or end), kept
    /// for accounting (`specs::acct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
}

/// The pod status reason of a pod its node is stopping (SIGTERM sent, not
/// every process gone): the node reports it, the server lists deleted ones
/// with it, `get pods` shows it.
pub const TERMINATING: &str = "Terminating";
/// A running pod's reason when its node could not apply all of its
/// `spec.tuning` (the message says what and why).
pub const TUNING_INCOMPLETE: &str = "TuningIncomplete";

/// The condition of a pod whose readiness a rollout waits for.
pub const POD_READY: &str = "Ready";

/// One of a pod's conditions (`Ready`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: crate::api::ConditionStatus,
    /// Unix seconds when `status` last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<u64>,
}

impl PodStatus {
    /// Since when the pod is `Ready` (unix seconds); `None` when it is not.
    pub fn ready_since(&self) -> Option<u64> {
        self.conditions
            .iter()
            .find(|c| c.kind == POD_READY && c.status == crate::api::ConditionStatus::True)
            .map(|c| c.last_transition_time.unwrap_or(0))
    }
}

/// The placement a pod received, as reported and shown by `describe`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSummary {
    pub numa_affinity: NumaSet,
    pub containers: Vec<ContainerPlacementSummary>,
    /// Relaxed resources placed outside the affinity, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote: Vec<crate::engine::RemotePlacement>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPlacementSummary {
    pub name: String,
    pub cpu_policy: CpuPolicy,
    pub cpus: CpuSet,
    pub mems: NumaSet,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    pub state: ContainerState,
    #[serde(default)]
    pub restart_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    /// `OOMKilled`, `Error`, `Completed`, `CrashLoopBackOff`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Running and passing its readiness probe (running is enough without one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ready: bool,
    /// What its last run used, read from its cgroup as it ended.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "object_or_null")]
    pub usage: Option<ContainerUsage>,
}

/// An optional object, read from an object or null only. Serde's derive
/// also reads a struct from a list of its fields in order, which would let
/// `usage: [null, null]` through as an empty usage against the API's schema.
fn object_or_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::{value::MapAccessDeserializer, MapAccess, Visitor};
    struct Object<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(Some)
        }
    }
    d.deserialize_option(Object(std::marker::PhantomData))
}

/// A container's CPU time and memory high-water mark, read by its node from
/// its cgroup when it ended (cgroup v1: `cpuacct.usage`,
/// `memory.max_usage_in_bytes`; v2: `cpu.stat` `usage_usec`, `memory.peak`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_nanos: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
    /// What could not be read, and why (a kernel without `memory.peak`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerState {
    #[default]
    Waiting,
    Running,
    Terminated,
}

#[cfg(test)]
mod tests {
    use super::ContainerStatus;

    #[test]
    fn a_containers_usage_is_an_object_or_null() {
        let table: [(&str, Result<Option<u64>, &str>); 4] = [
            (r#""usage":{"cpuNanos":5}"#, Ok(Some(5))),
            (r#""usage":null"#, Ok(None)),
            (r#""reason":null"#, Ok(None)),
            (r#""usage":[null,null]"#, Err("expected an object or null")),
        ];
        for (field, want) in table {
            let json = format!(r#"{{"name":"m","state":"Running",{field}}}"#);
            let got = serde_json::from_str::<ContainerStatus>(&json)
                .map(|c| c.usage.and_then(|u| u.cpu_nanos))
                .map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(g), Ok(w)) => assert_eq!(*g, w, "{json}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{json}: {e}"),
                _ => panic!("{json}: got {got:?}, want {want:?}"),
            }
        }
    }
}
