//! The server's Prometheus metrics (`GET /metrics`, OpenMetrics text through
//! `prometheus-client`). Every metric is listed with its meaning in
//! `docs/metrics.md`; a test fails when the scrape and that list disagree.
//!
//! Two kinds: counters and histograms the hot paths update (a relaxed atomic
//! add or a histogram observe, with `'static` labels: no allocation, no lock
//! held across an await), and gauges computed at scrape time from the leading
//! controller's queue and its scheduler's per-node mirrors, so nothing on the
//! scheduling path keeps them up to date. A server that does not lead (etcd,
//! several servers) shows no queue or capacity gauges.

use std::sync::Arc;

use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::leading::Leading;
use crate::scheduler::ReasonKind;

/// The content type of a scrape (what `encode` writes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets in seconds: 50 µs to about 1.6 s, doubling.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 2.0, 16)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
pub enum Outcome {
    /// The pod (or gang) got a node.
    Bound,
    /// It fits nowhere now and waits for a cluster event.
    Unschedulable,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabel {
    result: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: ReasonKind,
}

/// What the controller updates; cheap to clone (shared atomics), kept across
/// the controllers of successive leader terms.
#[derive(Debug, Clone)]
pub struct ControllerMetrics {
    attempts: Family<ResultLabel, Counter>,
    latency: Histogram,
    bindings: Counter,
    rejections: Family<ReasonLabel, Counter>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        ControllerMetrics {
            attempts: Family::default(),
            latency: Histogram::new(latency_buckets()),
            bindings: Counter::default(),
            rejections: Family::default(),
        }
    }
}

impl ControllerMetrics {
    /// One scheduling attempt (a pod, or a gang as one) and how long the
    /// scheduler took to decide it.
    pub fn attempt(&self, result: Outcome, seconds: f64) {
        self.attempts.get_or_create(&ResultLabel { result }).inc();
        self.latency.observe(seconds);
    }

    /// Nodes ruled out for an unschedulable pod, per reason.
    pub fn rejected(&self, counts: &std::collections::BTreeMap<ReasonKind, usize>) {
        for (reason, n) in counts {
            self.rejections.get_or_create(&ReasonLabel { reason: *reason }).inc_by(*n as u64);
        }
    }

    /// Bindings the store acknowledged.
    pub fn bound(&self, n: u64) {
        self.bindings.inc_by(n);
    }
}

/// Every metric of one server.
pub struct Metrics {
    registry: Registry,
    /// API watch streams open now.
    pub watches: Gauge,
    leading: Arc<Leading>,
}

impl Metrics {
    /// Registers the controller's metrics and the store's commit latency
    /// (`Store::commit_seconds`); `leading` gives the scrape-time gauges.
    pub fn new(controller: &ControllerMetrics, store_commit: Histogram, leading: Arc<Leading>) -> Metrics {
        let mut r = Registry::with_prefix("pinion");
        let c = controller.clone();
        r.register("scheduling_attempts", "Scheduling attempts (a gang counts once), by result", c.attempts);
        r.register("scheduling_duration_seconds", "Time the scheduler took to decide one attempt", c.latency);
        r.register("bindings", "Bindings the store acknowledged (a gang's members each count)", c.bindings);
        r.register("scheduler_rejections", "Nodes ruled out for pods that fit nowhere, by reason", c.rejections);
        r.register(
            "store_commit_duration_seconds",
            "Time one store batch took to commit (sled write and flush, or etcd transaction)",
            store_commit,
        );
        let watches = Gauge::default();
        r.register("api_watches", "API watch streams open now", watches.clone());
        Metrics { registry: r, watches, leading }
    }

    /// The scrape: the registered metrics, then the gauges read now from the
    /// leading controller; OpenMetrics text, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let now = self.scrape_time_registry();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_registry(&mut out, &now);
        let _ = encode_eof(&mut out);
        out
    }

    fn scrape_time_registry(&self) -> Registry {
        let mut r = Registry::with_prefix("pinion");
        let Some(controller) = self.leading.current() else { return r };
        let pending: Family<[(&'static str, &'static str); 1], Gauge> = Family::default();
        for (reason, n) in controller.pending_by_reason() {
            pending.get_or_create(&[("reason", reason)]).set(n as i64);
        }
        r.register("pending_pods", "Pods waiting in the scheduling queue, by reason", pending);

        type NodeFamily = Family<[(&'static str, String); 1], Gauge>;
        type NumaFamily = Family<[(&'static str, String); 2], Gauge>;
        let capacity = controller.capacity();
        let figures: [Figure; 6] = [
            ("cpus", "CPUs that may be handed out (not reserved)", |f| u64::from(f.cpus)),
            ("free_cpus", "CPUs not reserved and not held exclusively (bindings in flight included)", |f| {
                u64::from(f.free_cpus)
            }),
            ("memory_bytes", "Memory", |f| f.memory_bytes),
            ("free_memory_bytes", "Memory not allocated to pods (bindings in flight included)", |f| {
                f.free_memory_bytes
            }),
            ("hugepages_bytes", "Huge pages, all page sizes", |f| f.hugepages_bytes),
            ("free_hugepages_bytes", "Huge pages not allocated to pods, all page sizes", |f| f.free_hugepages_bytes),
        ];
        for (name, help, value) in figures {
            let node_family = NodeFamily::default();
            let numa_family = NumaFamily::default();
            for node in &capacity {
                let mut total = 0u64;
                for n in &node.numa {
                    let v = value(n);
                    total = total.saturating_add(v);
                    let labels = [("node", node.name.clone()), ("numa", n.id.to_string())];
                    numa_family.get_or_create(&labels).set(gauge_value(v));
                }
                node_family.get_or_create(&[("node", node.name.clone())]).set(gauge_value(total));
            }
            r.register(format!("node_{name}"), format!("{help}, per node"), node_family);
            r.register(format!("numa_{name}"), format!("{help}, per NUMA node"), numa_family);
        }
        r
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").field("registry", &self.registry).finish_non_exhaustive()
    }
}

/// A capacity gauge: its name (after `node_` or `numa_`), its help, and its
/// value from one NUMA node's figures.
type Figure = (&'static str, &'static str, fn(&crate::scheduler::NumaFigures) -> u64);

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
