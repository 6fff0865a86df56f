//! Decisions per second of the admission engine: a 4-CPU exclusive Guaranteed pod
//! on the 112-CPU seed machine, the 17-node `128ia64-17n4s2c` fixture, a
//! synthetic 64-node machine (`pack:8 numa:8 core:8 pu:2`) and a synthetic
//! 8-socket machine of 4,096 CPUs (`pack:8 numa:1(memory=1024GiB) core:256 pu:2`), under every
//! topology-manager policy, on a quarter-full machine (`admit-4cpu`); a pod
//! wider than one NUMA node on the many-node machines (`admit-wide`: 12 CPUs
//! on 17 nodes, 40 on 64), which runs the full candidate search; and the
//! CPU-manager options (`admit-options`): `distribute-cpus-across-numa` over
//! two nodes of the seed machine, three of the 4,096-CPU one (every
//! combination tried) and three of the 64-node one (the closed form), and
//! `prefer-align-cpus-by-uncorecache` on an AMD-like machine (`pack:2 numa:4
//! core:16 pu:2`, L3 groups of 4 cores) a quarter full.
//!
//! Run: `cargo bench -p specs --bench admit` (one group: `-- admit-options`). Criterion prints the time per
//! decision; decisions/s = 1 / that time (also printed as "thrpt" in elem/s).
//!
//! Each sample reports the fastest chunk of 64 consecutive decisions, scaled, not
//! the mean wall time: on a shared, loaded machine preemption would otherwise
//! inflate the figure several-fold. It is the cost on one uncontended core.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use specs::engine::{admit, Allocations, NodeSettings};
use specs::pod::{Pod, TopologyPolicy};
use specs::topology::NodeTopology;

fn pod(cpus: &str) -> Pod {
    specs::testing::pod("bench").named("c").guaranteed(cpus, "4Gi").build()
}

fn machines() -> Vec<(&'static str, NodeTopology)> {
    let seventeen: NodeTopology =
        serde_json::from_str(include_str!("../tests/data/128ia64-17n4s2c.json")).expect("committed fixture");
    vec![
        ("112cpu-2numa", specs::topology::synthetic::parse("pack:2 numa:1 core:28 pu:2").expect("constant")),
        ("128cpu-17numa", seventeen),
        ("1024cpu-64numa", specs::topology::synthetic::parse("pack:8 numa:8 core:8 pu:2").expect("constant")),
        (
            "4096cpu-8socket",
            specs::topology::synthetic::parse("pack:8 numa:1(memory=1024GiB) core:256 pu:2").expect("constant"),
        ),
    ]
}

/// 256 CPUs on 8 NUMA nodes, each with 4 L3 groups of 4 cores (an AMD EPYC
/// in NPS4 with 4-core CCXs).
fn amd_like() -> NodeTopology {
    let mut t = specs::topology::synthetic::parse("pack:2 numa:4 core:16 pu:2").expect("constant");
    for c in &mut t.cpus {
        c.uncore_cache = Some(c.core / 4);
    }
    t
}

/// Fills a quarter of the machine with 4-CPU pods, so the search has something to avoid.
fn quarter_full(t: &NodeTopology, p: &Pod) -> Allocations {
    let mut a = Allocations::default();
    let s = NodeSettings::default();
    for i in 0..(t.cpus.len() / 16) {
        let key = format!("pre-{i}");
        if let Ok(placed) = admit(t, &s, &a, &key, p) {
            a.apply(&key, placed);
        }
    }
    a
}

/// Decisions per chunk: short enough (well under a scheduler time slice) that
/// some chunks run without being preempted even on a loaded machine.
const CHUNK: u64 = 64;

/// Runs `f` `iters` times in chunks of `CHUNK` and returns the time the fastest
/// chunk took, scaled to `iters`: the cost on one uncontended core.
fn uncontended<R>(iters: u64, mut f: impl FnMut() -> R) -> Duration {
    let mut best = Duration::MAX;
    let mut done = 0;
    while done < iters {
        let k = CHUNK.min(iters - done);
        let t = Instant::now();
        for _ in 0..k {
            std::hint::black_box(f());
        }
        let per = t.elapsed() / u32::try_from(k).unwrap_or(1);
        best = best.min(per);
        done += k;
    }
    best.saturating_mul(u32::try_from(iters).unwrap_or(u32::MAX))
}

fn bench(c: &mut Criterion) {
    let p = pod("4");
    let mut g = c.benchmark_group("admit-4cpu");
    g.throughput(Throughput::Elements(1));
    for (name, t) in machines() {
        let a = quarter_full(&t, &p);
        for policy in [
            TopologyPolicy::None,
            TopologyPolicy::BestEffort,
            TopologyPolicy::Restricted,
            TopologyPolicy::SingleNumaNode,
        ] {
            let s = NodeSettings { topology_policy: policy, ..Default::default() };
            assert!(admit(&t, &s, &a, "x", &p).is_ok(), "{name} {policy:?} admits");
            g.bench_with_input(BenchmarkId::new(name, format!("{policy:?}")), &s, |b, s| {
                b.iter_custom(|iters| uncontended(iters, || admit(&t, s, &a, "x", &p)))
            });
        }
    }
    g.finish();

    // Requests wider than a node: no fast path, the whole polynomial candidate
    // search runs (single-numa-node refuses them, which is measured too).
    let mut g = c.benchmark_group("admit-wide");
    g.throughput(Throughput::Elements(1));
    for (name, t) in machines().into_iter().skip(1).filter(|(_, t)| t.cpus.len() <= 1024) {
        let cpus = if t.numa_nodes.len() > 32 { "40" } else { "12" };
        let p = pod(cpus);
        for policy in [
            TopologyPolicy::None,
            TopologyPolicy::BestEffort,
            TopologyPolicy::Restricted,
            TopologyPolicy::SingleNumaNode,
        ] {
            let s = NodeSettings { topology_policy: policy, ..Default::default() };
            let a = Allocations::default();
            let id = BenchmarkId::new(format!("{name}-{cpus}cpu"), format!("{policy:?}"));
            g.bench_with_input(id, &s, |b, s| b.iter_custom(|iters| uncontended(iters, || admit(&t, s, &a, "x", &p))));
        }
    }
    g.finish();

    let mut g = c.benchmark_group("admit-options");
    g.throughput(Throughput::Elements(1));
    let dist = |t: &NodeTopology| {
        let mut s = NodeSettings::default();
        s.set_option("distribute-cpus-across-numa", "true").expect("known option");
        (t.clone(), s, Allocations::default())
    };
    let mut l3 = NodeSettings::default();
    l3.set_option("prefer-align-cpus-by-uncorecache", "true").expect("known option");
    let amd = amd_like();
    let all = machines();
    let cases = [
        ("112cpu-2numa-distribute", dist(&all[0].1), "58"),
        ("4096cpu-8socket-distribute", dist(&all[3].1), "1200"),
        ("1024cpu-64numa-distribute", dist(&all[2].1), "40"),
        ("256cpu-amd-l3", (amd.clone(), l3, quarter_full(&amd, &pod("4"))), "6"),
    ];
    for (name, (t, s, a), cpus) in cases {
        let p = pod(cpus);
        assert!(admit(&t, &s, &a, "x", &p).is_ok(), "{name} admits");
        g.bench_function(BenchmarkId::new(name, format!("{cpus}cpu")), |b| {
            b.iter_custom(|iters| uncontended(iters, || admit(&t, &s, &a, "x", &p)))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
