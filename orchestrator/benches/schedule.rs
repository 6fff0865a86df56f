//! Scheduling throughput in-process: pods bound per second on 1,000 and 5,000
//! hollow nodes of 2 to 8 NUMA nodes, and the process's memory (RSS) once
//! 50,000 pods are bound on 5,000 nodes.
//!
//! Run: `cargo bench -p orchestrator --bench schedule` (prints one line per case).
//! Deterministic: node shapes and pods come from a fixed-seed generator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use orchestrator::scheduler::{NodeInfo, Scheduler, SchedulerConfig};
use specs::topology::{Cpu, NumaNode};
use specs::{Allocations, CpuSet, NodeSettings, NodeTopology, Pod, TopologyPolicy};

const GI: u64 = 1 << 30;

/// xorshift64*: a fixed sequence, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// `pack:sockets numa:per_socket core:cores pu:2`, CPUs numbered as Linux does
/// on such machines (first threads of all cores, then the siblings).
fn machine(numa: u32, cores: u32) -> NodeTopology {
    let sockets = if numa & 1 == 0 { 2 } else { 1 };
    let per_socket = numa / sockets;
    let total_cores = numa * cores;
    let mut t = NodeTopology::default();
    for n in 0..numa {
        let mut cpus = CpuSet::new();
        for c in 0..cores {
            let core = n * cores + c;
            for thread in 0..2 {
                let id = core + thread * total_cores;
                cpus.insert(id).expect("a benchmark machine fits in a CpuSet");
                t.cpus.push(Cpu { id, core, socket: n / per_socket, die: None, numa: Some(n), uncore_cache: None });
            }
        }
        t.numa_nodes.push(NumaNode {
            kind: Default::default(),
            id: n,
            cpus,
            memory_bytes: 64 * GI,
            distances: (0..numa).map(|j| if j == n { 10 } else { 21 }).collect(),
            hugepages: Vec::new(),
        });
    }
    t.cpus.sort_by_key(|c| c.id);
    t
}

fn nodes(count: usize, rng: &mut Rng) -> Vec<NodeInfo> {
    // A few shapes shared by many nodes, as a real fleet has.
    let shapes: Vec<Arc<NodeTopology>> =
        [(2, 16), (2, 32), (4, 8), (4, 16), (8, 8), (8, 12)].iter().map(|&(n, c)| Arc::new(machine(n, c))).collect();
    (0..count)
        .map(|i| {
            let topology = shapes[rng.range(0, shapes.len() as u64 - 1) as usize].clone();
            NodeInfo {
                name: format!("node-{i:05}"),
                labels: BTreeMap::from([("rack".to_string(), format!("r{}", i % 40))]),
                topology,
                settings: NodeSettings {
                    reserved_cpus: CpuSet::single(0).expect("id within MAX_ID"),
                    ..NodeSettings::default()
                },
                allocations: Allocations::default(),
                ready: true,
            }
        })
        .collect()
}

fn pod(i: usize, rng: &mut Rng) -> Pod {
    let cpus = rng.range(1, 8);
    let mem = rng.range(1, 8);
    let policy = if i & 1 == 0 { TopologyPolicy::SingleNumaNode } else { TopologyPolicy::BestEffort };
    specs::testing::pod(&format!("pod-{i}"))
        .guaranteed(&cpus.to_string(), &(mem * GI).to_string())
        .policy(policy)
        .build()
}

/// CPU seconds this thread has used (utime + stime from `/proc/thread-self/stat`,
/// in clock ticks of 10 ms): on a shared host, wall time also counts waiting.
fn thread_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn run(node_count: usize, pod_count: usize) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ node_count as u64);
    let pods: Vec<(String, Pod)> = (0..pod_count).map(|i| (format!("default/pod-{i}"), pod(i, &mut rng))).collect();
    // Memory before the scheduler exists: the pods above belong to the bench.
    let rss_before = rss_kib();
    let mut s = Scheduler::new(SchedulerConfig::default());
    for n in nodes(node_count, &mut rng) {
        s.upsert_node(n);
    }
    let start = Instant::now();
    let cpu_start = thread_cpu_secs();
    let mut bound = 0usize;
    let mut first_error = None;
    for (n, (key, p)) in pods.iter().enumerate() {
        match s.schedule(key, p, std::time::Instant::now()) {
            Ok(_) => bound += 1,
            Err(u) => {
                first_error.get_or_insert(u.message);
            }
        }
        if n == 99 && bound == 0 {
            // Every pod is refused on an empty cluster: the engine says no to
            // everything (not built yet?). Timing that would measure nothing.
            println!("nodes={node_count}: the first 100 pods were all unschedulable; stopping");
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_secs().zip(cpu_start).map(|(b, a)| b - a);
    let rss_after = rss_kib();
    let mib = |k: Option<u64>| k.map_or("?".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
    println!(
        "nodes={node_count} pods={pod_count} bound={bound} time={secs:.3}s rate={:.0} pods/s \
         cpu={} rate_cpu={} pods/s rss={} MiB (scheduler: {} MiB)",
        bound as f64 / secs,
        cpu.map_or("?".to_string(), |c| format!("{c:.2}s")),
        cpu.filter(|c| *c > 0.0).map_or("?".to_string(), |c| format!("{:.0}", bound as f64 / c)),
        mib(rss_after),
        mib(rss_after.zip(rss_before).map(|(a, b)| a.saturating_sub(b))),
    );
    if let Some(e) = first_error {
        println!("  first unschedulable: {e}");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument picks cases by node count.
    let filter: Option<usize> = std::env::args().skip(1).find_map(|a| a.parse().ok());
    for (nodes, pods) in [(1_000, 10_000), (5_000, 50_000)] {
        if filter.is_none() || filter == Some(nodes) {
            run(nodes, pods);
        }
    }
}
