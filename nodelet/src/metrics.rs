//! The node's Prometheus metrics (`GET /metrics` on the endpoint, and on the
//! plain-HTTP loopback listener of `--local-listen`): pod start latency, in
//! total and per step, container restarts, admissions and rejections by
//! reason. Every metric is listed with its meaning in `docs/metrics.md`.
//!
//! The steps are those of the pod-start breakdown, in the order a start
//! passes them, each timed from the step before: the planner's (`Admitted`,
//! `CheckpointWritten`), then the runtime's, stamped on the monotonic clock
//! (`StartTrace`) so that the shim, a separate process, can report its own
//! (`ShimRunning`, `ContainerBuilt`, `ContainerStarted`) in its `ok` line.
//! Labels are bounded: a step or a rejection reason, never a pod.

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use specs::RejectReason;

/// The content type of a scrape (what `encode` writes).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One step of a pod start, timed from the step before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum Step {
    /// From the change's arrival to the engine's admission.
    Admitted,
    /// From the admission to the checkpoint holding it on disk.
    CheckpointWritten,
    /// The runtime's start began (the first stamp of a `StartTrace`; no step of its own).
    RuntimeEntered,
    /// The container's bundle (spec, rootfs) written.
    BundlePrepared,
    /// The pod's network made, made beside the bundle (only when the start
    /// waited on it: a pod with a CNI network).
    NetworkReady,
    /// The agent spawns the shim (stamped as it calls spawn: the fork and
    /// exec count in `ShimRunning`).
    ShimSpawned,
    /// The shim's first instruction (in the shim).
    ShimRunning,
    /// libcontainer built (created) the container (in the shim).
    ContainerBuilt,
    /// The container's process started (in the shim).
    ContainerStarted,
    /// The agent read the shim's report.
    ShimReported,
    /// The runtime's start returned to the agent.
    StartReturned,
}

/// The runtime's part of a start as monotonic stamps (nanoseconds of
/// `CLOCK_MONOTONIC`, one clock for the agent and its shims), in order.
#[derive(Debug, Clone, Default)]
pub struct StartTrace {
    stamps: Vec<(Step, u64)>,
}

impl StartTrace {
    /// A trace whose first stamp is now (`Step::RuntimeEntered`).
    pub fn begin() -> StartTrace {
        let mut t = StartTrace { stamps: Vec::with_capacity(8) };
        t.mark(Step::RuntimeEntered);
        t
    }

    pub(crate) fn mark(&mut self, step: Step) {
        self.mark_at(step, monotonic_ns());
    }

    /// A stamp taken elsewhere (the shim's).
    pub(crate) fn mark_at(&mut self, step: Step, ns: u64) {
        self.stamps.push((step, ns));
    }

    /// Each step after the first with its time since the stamp before, in seconds.
    pub fn steps(&self) -> impl Iterator<Item = (Step, f64)> + '_ {
        self.stamps.windows(2).map(|w| (w[1].0, w[1].1.saturating_sub(w[0].1) as f64 / 1e9))
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes of this machine.
pub(crate) fn monotonic_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => (t.tv_sec() as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec() as u64),
        Err(_) => 0,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StepLabel {
    step: Step,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: Reason,
}

/// `RejectReason` as a label value, its variant's name (specs stays free of
/// the metrics crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Reason(RejectReason);

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelValueEncoder) -> std::fmt::Result {
        use std::fmt::Write;
        write!(encoder, "{:?}", self.0)
    }
}

/// Every metric of one node agent; its handles are shared atomics.
pub(crate) struct Metrics {
    registry: Registry,
    pod_start: Histogram,
    steps: Family<StepLabel, Histogram, fn() -> Histogram>,
    restarts: Counter,
    admissions: Counter,
    rejections: Family<ReasonLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let pod_start = latency_histogram();
        let steps = Family::new_with_constructor(latency_histogram as fn() -> Histogram);
        let (restarts, admissions, rejections) = (Counter::default(), Counter::default(), Family::default());
        let mut r = Registry::with_prefix("pinion");
        r.register(
            "pod_start_duration_seconds",
            "From a pod's arrival at the agent to the start of its last container",
            pod_start.clone(),
        );
        r.register("pod_start_step_duration_seconds", "One step of a pod start, from the step before", steps.clone());
        r.register("container_restarts", "Containers restarted after they exited", restarts.clone());
        r.register("pod_admissions", "Pods the engine admitted on this node", admissions.clone());
        r.register("pod_rejections", "Admissions the engine refused on this node, by reason", rejections.clone());
        Metrics { registry: r, pod_start, steps, restarts, admissions, rejections }
    }
}

/// 100 µs to about 3.3 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("registry", &self.registry).finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn new() -> Arc<Metrics> {
        Arc::new(Metrics::default())
    }

    /// OpenMetrics text, ending in `# EOF`.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    pub(crate) fn step(&self, step: Step, seconds: f64) {
        self.steps.get_or_create(&StepLabel { step }).observe(seconds);
    }

    pub(crate) fn trace(&self, trace: &StartTrace) {
        for (step, seconds) in trace.steps() {
            self.step(step, seconds);
        }
    }

    pub(crate) fn pod_started(&self, seconds: f64) {
        self.pod_start.observe(seconds);
    }

    pub(crate) fn restarted(&self) {
        self.restarts.inc();
    }

    pub(crate) fn admitted(&self) {
        self.admissions.inc();
    }

    pub(crate) fn rejected(&self, reason: RejectReason) {
        self.rejections.get_or_create(&ReasonLabel { reason: Reason(reason) }).inc();
    }
}
