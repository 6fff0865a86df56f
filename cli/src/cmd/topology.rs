//! `pinion topology [NODE]`: each node drawn (sockets, NUMA nodes, cores with
//! their threads, reserved CPUs) with the pod that holds each exclusive or
//! immovable CPU, from the nodes' own allocation reports.

use std::collections::BTreeMap;
use std::process::ExitCode;

use specs::CpuPolicy;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only this node.
    pub node: Option<String>,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let nodes = match &args.node {
        Some(n) => vec![client.get_node(n).await?],
        None => client.list_nodes(None).await?.items,
    };
    if nodes.is_empty() {
        outln!("no nodes");
    }
    for (i, node) in nodes.iter().enumerate() {
        let mut holders = BTreeMap::new();
        for (pod, placement) in &node.status.allocations.pods {
            for c in &placement.containers {
                if matches!(c.cpu_policy, CpuPolicy::Exclusive | CpuPolicy::Immovable) {
                    for cpu in c.cpus.iter() {
                        holders.insert(cpu, pod.clone());
                    }
                }
            }
        }
        if i > 0 {
            outln!();
        }
        let mut topology = node.spec.topology.clone();
        topology.reserved_cpus.union_with(&node.spec.settings.reserved_cpus);
        outln!("node {} ({:?})", node.metadata.name, node.status.condition);
        out!("{}", specs::topology::draw::draw(&topology, &holders));
    }
    Ok(ExitCode::SUCCESS)
}
